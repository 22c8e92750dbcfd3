"""The testbed league (``python -m recipe_apo.testbed mode=league``): every method ranked against every other per
scenario with the testbed's paired verdict rule; a tiny league end to end and the verdicts on hand-made runs."""

import json
import math

import pytest
from helpers.testbed_tiny import TINY_RUN as TINY
from hydra import initialize_config_module

# The zero-variance denominator's league metrics (``Metric.league``) as a league row holds them: the mean over the
# rounds, and the largest of any round of any seed (``peak``).
ZV_MEAN, ZV_MAX = "zero_variance/ratio_dev_mean_avg", "zero_variance/ratio_dev_max_max"

METRIC = "success_final"
TINY_LEAGUE = TINY + ["rounds=2", "mode=league", "seeds=[0,1,2]", "league.methods=[grpo,codapo]", "~league.extra",
                      "~league.variant_of", 'league.scenarios=[[],["task.max_len=3"]]']


@pytest.fixture(scope="module")
def hydra_ctx():
    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        yield


@pytest.fixture(scope="module")
def tiny_league(hydra_ctx, tmp_path_factory):
    from recipe_apo.testbed.league import run_league

    out = tmp_path_factory.mktemp("league")
    return out, run_league(TINY_LEAGUE, out, show_progress=False)


def test_the_league_config_names_its_methods_and_scenarios(hydra_ctx):
    from hydra import compose

    from recipe_apo.testbed.configs import league_entries
    from recipe_apo.testbed.league import league_scenarios

    cfg = compose(config_name="testbed", overrides=["mode=league"])
    entries = league_entries(cfg)
    assert list(entries) == ["grpo", "grpo_zv", "drgrpo", "apo", "apo_zv", "codapo", "agpo_dual", "agpo", "r2po",
                             "apo_prior",
                             "apo_one_sided", "grpo_2n", "drgrpo_2n", "apo_2n"]
    assert entries["apo_zv"] == ["method=apo", "algorithm.zero_variance=exclude"]
    assert entries["apo_prior"] == ["method=apo", "algorithm.apo.anchor_order=prior"]
    assert entries["apo_one_sided"] == ["method=apo", "actor_rollout_ref.actor.policy_loss.loss_mode=apo_one_sided"]
    assert league_scenarios(cfg.league.scenarios) == {
        "default": [], "task.max_len=6": ["task.max_len=6"], "many_updates": ["scenario=many_updates"],
        "long_response": ["scenario=long_response"], "stale": ["scenario=stale"],
        "stale,staleness=4": ["scenario=stale", "staleness=4"],
        "task=modsum": ["task=modsum"]}
    assert cfg.league.metric == METRIC
    # Without variant_of every method gets every variant; the league's own methods come after league.methods.
    wide = league_entries(compose(config_name="testbed", overrides=["~league.variant_of", "league.methods=[grpo]"]))
    assert list(wide) == ["grpo", "grpo_zv", "apo_prior", "apo_prior_zv", "apo_one_sided", "apo_one_sided_zv",
                          "grpo_2n", "grpo_2n_zv", "drgrpo_2n", "drgrpo_2n_zv", "apo_2n", "apo_2n_zv"]


@pytest.mark.parametrize("override, match", [
    ("+league.variant_of.zz=[grpo]", r"league.variant_of.zz=\[grpo\]: zz is not a suffix of league.variants"),
    ("league.variant_of.zv=[grpoo]", r"league.variant_of.zv=\[grpoo\]: grpoo not a label of methods or league.extra"),
    ('+league.extra.grpo=["method=grpo"]', r"league.extra.grpo=\[method=grpo\]: league.methods runs grpo already"),
])
def test_league_method_settings_are_checked(hydra_ctx, override, match):
    from hydra import compose

    from recipe_apo.testbed.configs import league_entries

    with pytest.raises(ValueError, match=match):
        league_entries(compose(config_name="testbed", overrides=[override]))


def test_tiny_league_writes_its_report_with_every_pair_ranked(tiny_league):
    from recipe_apo.testbed.report.stats import paired

    out, league = tiny_league
    for name in ("league.md", "league.json", "league.png"):
        assert (out / name).stat().st_size > 0, name
    labels = ["grpo", "grpo_zv", "codapo", "codapo_zv"]
    assert league["labels"] == labels
    assert league["families"] == {"grpo": "grpo", "grpo_zv": "grpo", "codapo": "codapo", "codapo_zv": "codapo"}
    assert league["variants"] == {"zv": ["algorithm.zero_variance=exclude"]}
    assert "`<method>_zv`: the method with `algorithm.zero_variance=exclude`." in (out / "league.md").read_text()
    assert list(league["scenarios"]) == ["default", "task.max_len=3"]
    on_disk = json.loads((out / "league.json").read_text())
    markdown = (out / "league.md").read_text()
    for name, scenario in on_disk["scenarios"].items():
        summary = json.loads((out / name / "summary.json").read_text())
        assert (out / name / "report.md").exists()
        assert summary["config"]["task"]["max_len"] == (3 if name == "task.max_len=3" else 8)
        assert {label: m["zero_variance"] for label, m in summary["methods"].items()} == {
            "grpo": "keep", "grpo_zv": "exclude", "codapo": "keep", "codapo_zv": "exclude"}
        seeds = [str(s) for s in summary["seeds"]]
        assert seeds == ["0", "1", "2"]
        value = {label: [summary["runs"][label][s][METRIC] for s in seeds] for label in labels}
        mean = {label: sum(v) / 3 for label, v in value.items()}
        # Every ordered pair: the testbed's paired statistics of a - b on the same seeds.
        for a in labels:
            for b in labels:
                if a == b:
                    continue
                expected = paired(value[a], value[b])
                got = scenario["matrix"][a][b]
                assert got["per_seed"] == pytest.approx(expected["per_seed"], abs=1e-12)
                assert got["mean"] == pytest.approx(expected["mean"], abs=1e-12)
                assert (got["beyond_seed_noise"], got["seeds_agree"]) == (expected["beyond_seed_noise"],
                                                                           expected["seeds_agree"])
        rows = {row["method"]: row for row in scenario["rows"]}
        assert set(rows) == set(labels)
        # Rows in rank order; the rank counts the methods with a higher mean.
        assert [row["rank"] for row in scenario["rows"]] == sorted(row["rank"] for row in scenario["rows"])
        for label, row in rows.items():
            assert row["rank"] == 1 + sum(mean[o] > mean[label] for o in labels)
            assert row[METRIC]["mean"] == pytest.approx(mean[label], abs=1e-12)
            std = math.sqrt(sum((x - mean[label]) ** 2 for x in value[label]) / 2)
            assert row[METRIC]["se"] == pytest.approx(std / math.sqrt(3), abs=1e-12)
            # Wins and losses are the pairs beyond seed noise, and the two sides of a pair agree.
            wins = [o for o in labels if o != label and paired(value[label], value[o])["beyond_seed_noise"]
                    and mean[label] > mean[o]]
            losses = [o for o in labels if o != label and paired(value[label], value[o])["beyond_seed_noise"]
                      and mean[label] < mean[o]]
            assert (row["wins"], row["losses"]) == (wins, losses)
            for other in wins:
                assert label in rows[other]["losses"]
            line = (f"| {row['rank']} | {label} | {row[METRIC]['mean']:.3f} +- {row[METRIC]['se']:.3f} | ")
            assert line in markdown
        # The zero-variance variants record how far their denominator is off per mini-batch (2 per round here).
        for label in ("grpo_zv", "codapo_zv"):
            assert rows[label][ZV_MAX] == max(summary["runs"][label][s][ZV_MAX] for s in seeds)
            assert 0.0 <= rows[label][ZV_MEAN]["mean"] <= rows[label][ZV_MAX]
            for s in seeds:
                assert summary["runs"][label][s][ZV_MEAN] >= 0.0
        assert ZV_MEAN not in rows["grpo"]
        assert rows["codapo"]["codapo/resampled_avg"]["mean"] == 0.5  # 2 rounds (0 and 1): round 1 resampled
        # Each method at work: its declared league metrics, headed by their words, "-" where a row has none.
        section = markdown.split(f"## {name}:")[1].split("\n## ")[0]
        assert "| codapo/resampled: 1 when the step trained on the kept prompts of the step before |" in section
        assert f"| codapo | 0.500 +- 0.000 | {rows['codapo']['codapo/kept_prompts_avg']['mean']:.3f} +- " in section
        assert f"| grpo_zv | {rows['grpo_zv'][ZV_MEAN]['mean']:.3f} +- " in section
        assert f" | {rows['grpo_zv'][ZV_MAX]:.3f} |" in section


def test_league_markdown_cells_follow_the_matrix(tiny_league):
    from recipe_apo.testbed.report.league import league_markdown

    _, league = tiny_league
    text = league_markdown(league)
    for name, scenario in league["scenarios"].items():
        order = [row["method"] for row in scenario["rows"]]
        matrix = text.split(f"## {name}:")[1].split("| row - column | ")[1].splitlines()[2 : 2 + len(order)]
        for a, line in zip(order, matrix):
            cells = [c.strip() for c in line.split("|")[1:-1]]
            assert cells[0] == a
            for b, cell in zip(order, cells[1:]):
                if a == b:
                    assert cell == "."
                    continue
                p = scenario["matrix"][a][b]
                text_mean = f"{p['mean']:+.3f}"
                assert cell == (f"**{text_mean}** {p['seeds_agree']}/{p['seeds']}" if p["beyond_seed_noise"]
                                else f"{text_mean} {p['seeds_agree']}/{p['seeds']}")


def _fake_summary(values: dict[str, list[float]]) -> dict:
    """A summary as build_summary writes it, from hand-set final successes per seed."""
    from recipe_apo.testbed.report.stats import compare_runs

    labels = list(values)
    seeds = list(range(len(next(iter(values.values())))))
    per_run = {label: {str(s): {METRIC: v[s]} for s in seeds} for label, v in values.items()}
    aggregate, comparisons = compare_runs(per_run, labels, seeds, metrics=[METRIC])
    return {"methods": {label: {} for label in labels}, "seeds": seeds, "runs": per_run, "aggregate": aggregate,
            "paired": comparisons, "scenario": "default", "wall_s": 1.0,
            "config": {"rounds": 10, "actor_rollout_ref": {"actor": {"ppo_epochs": 1}},
                       "data": {"max_response_length": 20},
                       "task": {"name": "reverse", "alphabet": 4, "min_len": 1, "max_len": 8, "filler_mean": 0.6}}}


def test_league_verdicts_by_hand():
    from recipe_apo.testbed.report.league import build_league, league_markdown

    # x is ahead of y by 0.1 on every seed (beyond seed noise); z is ahead of y on two seeds of three and
    # behind x on one: within seed noise. Means: x 0.6, z 0.55, y 0.5.
    league = build_league({"default": _fake_summary({"y": [0.4, 0.5, 0.6], "x": [0.5, 0.6, 0.7],
                                                     "z": [0.45, 0.7, 0.5]})}, {"default": []}, METRIC)
    scenario = league["scenarios"]["default"]
    rows = {row["method"]: row for row in scenario["rows"]}
    assert [row["method"] for row in scenario["rows"]] == ["x", "z", "y"]
    assert [row["rank"] for row in scenario["rows"]] == [1, 2, 3]
    assert (rows["x"]["wins"], rows["x"]["losses"]) == (["y"], [])
    assert (rows["y"]["wins"], rows["y"]["losses"]) == ([], ["x"])
    assert (rows["z"]["wins"], rows["z"]["losses"]) == ([], [])
    assert scenario["matrix"]["x"]["y"]["mean"] == pytest.approx(0.1)
    assert scenario["matrix"]["y"]["x"]["per_seed"] == pytest.approx([-0.1, -0.1, -0.1])
    assert scenario["matrix"]["z"]["x"]["per_seed"] == pytest.approx([-0.05, 0.1, -0.2])
    assert scenario["matrix"]["z"]["x"]["seeds_agree"] == 2
    # SE of x: std 0.1 over 3 seeds -> 0.1 / sqrt(3) = 0.0577.
    assert rows["x"][METRIC]["se"] == pytest.approx(0.1 / math.sqrt(3))
    text = league_markdown(league)
    assert "| 1 | x | 0.600 +- 0.058 | - | - | - | y | - |" in text
    assert "| 3 | y | 0.500 +- 0.058 | - | - | - | - | x |" in text
    assert "| x | . | +0.050 2/3 | **+0.100** 3/3 |" in text
    assert "| y | **-0.100** 3/3 | -0.050 2/3 | . |" in text
    assert "| y | 3 (0-1), 0.500 +- 0.058 |" in text


def test_the_league_refuses_a_method_or_scenario_on_the_command_line(hydra_ctx, tmp_path):
    from recipe_apo.testbed.league import run_league

    with pytest.raises(ValueError, match="mode=league runs league.methods on league.scenarios; drop method=grpo"):
        run_league(["mode=league", "method=grpo"], tmp_path, show_progress=False)
    with pytest.raises(ValueError, match=r"league.methods=\[sapo\]: sapo is not a label of methods"):
        run_league(["mode=league", "league.methods=[sapo]"], tmp_path, show_progress=False)
