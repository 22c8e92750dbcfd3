"""scripts/r2po_head_scale.py on the tiny model: its three tables, the 0.02 start off pi_base and reset_adaptor's
1e-6 start on it, the bound as its formula gives it, and what it refuses in one line with exit status 2."""

from __future__ import annotations

from helpers.scripts import load_script, run_main

SCRIPT = load_script("r2po_head_scale")


def run(*args):
    return run_main(SCRIPT, *args)


def _table(lines, title):
    start = lines.index(title) + 4  # title, blank, header, rule
    rows = []
    while start < len(lines) and lines[start].startswith("|"):
        rows.append([cell.strip() for cell in lines[start].strip("|").split("|")])
        start += 1
    return rows


def test_the_three_tables_on_the_tiny_model(tiny_task):
    result = run(tiny_task["model"], "--prompts", "1", "--samples", "2", "--max-new-tokens", "4", "--updates", "2",
                 "--lr", "1e-3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = {row[0]: [float(v) for v in row[1:]] for row in _table(lines, "The start")}
    assert set(start) == {"0.02", "1e-06"}
    assert start["0.02"][2] > 1e-6 and start["0.02"][3] > 1e-3  # KL and range: pi_roll is off pi_base
    assert start["1e-06"][2] < 1e-10 and start["1e-06"][3] < 1e-6 and start["1e-06"][4] == 0.0  # nothing in bf16
    d = int(lines[0].split(" d ")[1].split(",")[0])
    l1 = float(lines[0].split("|h|_1 max ")[1].split(";")[0])
    bound = _table(lines, "The bound on |delta_v| from reset_adaptor's 1e-6")
    assert bound[0][0] == "0.001"
    for value, k in zip(bound[0][1:], (10, 20, 200)):
        assert float(value) == float(f"{d * (1e-6 + k * 1e-3) ** 2 * l1:.3g}")
    updates = _table(lines, "2 head-phase updates")
    assert [row[:2] for row in updates] == [["0.02", "0.001"], ["1e-06", "0.001"]]
    assert all(float(row[-1]) > 0 for row in updates)  # the head moved


def test_refusals(tiny_task, tmp_path):
    for args, message in [((tmp_path / "nowhere",), "is not a model folder"),
                          ((tiny_task["model"], "--lr", "0"), "every --std and --lr must be a finite number > 0"),
                          ((tiny_task["model"], "--samples", "1"), "--samples >= 2")]:
        result = run(*args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
