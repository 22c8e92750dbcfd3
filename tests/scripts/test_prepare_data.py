"""scripts/prepare_data.py on small local files the tests write: formats, schema, counts, the prompt template."""

import importlib.util
import json
import os
import subprocess
import sys

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.paths import ROOT as REPO_ROOT

ROOT = str(REPO_ROOT)
SCRIPT = os.path.join(ROOT, "scripts", "prepare_data.py")


def load_script():
    spec = importlib.util.spec_from_file_location("prepare_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


prep = load_script()

# Dr. GRPO's prompt (sail-sg/understand-r1-zero, train_zero_math.py, apply_qwen_math_template), verbatim.
def drgrpo_qwen_math_template(question):
    return (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n"
    )


def chatml(messages):
    # What Qwen2.5's chat template renders for plain messages with a system message, plus the generation prompt.
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return str(path)


def write_arrow_stream(path, rows):
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return str(path)


def train_rows(n):
    # SimpleRL's / Dr. GRPO's columns: `question` + `gt_answer` beside a templated `input`, which must be skipped.
    return [
        {"input": "<|im_start|>system ... TEMPLATED", "question": f"What is {i} + 1?", "gt_answer": str(i + 1),
         "answer": f"Add one: $\\boxed{{{i + 1}}}$", "level": 3 + i % 3, "subject": "Algebra"}
        for i in range(n)
    ]


def eval_rows(name, n):
    if name == "amc":  # AMC answers are floats
        return [{"problem": f"AMC {i}", "answer": float(i) + 100.0} for i in range(n)]
    if name in ("minerva", "olympiadbench"):  # lists of accepted forms, OlympiadBench's in $...$
        return [{"question": f"{name} {i}", "final_answer": [f"${i}.5$", f"\\frac{{{2 * i + 1}}}{{2}}"]}
                for i in range(n)]
    return [{"problem": f"{name} problem {i}", "answer": str(i)} for i in range(n)]


COUNTS = {"math_lvl3to5": 8523, "aime24": 30, "amc": 83, "math500": 500, "minerva": 272, "olympiadbench": 675}


@pytest.fixture(scope="module")
def paper_files(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    files = {"math_lvl3to5": write_jsonl(src / "train.jsonl", train_rows(COUNTS["math_lvl3to5"]))}
    for name in ("aime24", "amc", "math500", "minerva", "olympiadbench"):
        rows = eval_rows(name, COUNTS[name])
        if name == "math500":
            path = src / "math500.parquet"
            pq.write_table(pa.Table.from_pylist(rows), str(path))
        elif name == "amc":
            path = src / "amc.json"
            path.write_text(json.dumps(rows))
        elif name == "minerva":
            path = write_arrow_stream(src / "minerva.arrow", rows)
        else:
            path = write_jsonl(src / f"{name}.jsonl", rows)
        files[name] = str(path)
    return files


@pytest.fixture(scope="module")
def prepared(paper_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    argv = ["--out-dir", str(out)] + [f"--file={name}={path}" for name, path in paper_files.items()]
    assert prep.main(argv) == 0
    return out


def test_writes_all_six_splits_with_the_papers_counts(prepared, capsys):
    for name, count in COUNTS.items():
        frame = pd.read_parquet(prepared / f"{name}.parquet")
        assert len(frame) == count, name
        assert set(frame["data_source"]) == {name}


def test_schema_is_verls_preprocessing_layout(prepared):
    schema = pq.read_schema(prepared / "aime24.parquet")
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert schema.field("data_source").type == pa.string()
    assert schema.field("ability").type == pa.string()
    assert schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert schema.field("reward_model").type == pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
    # every file has the same schema, so verl can read several of them as one validation set
    for name in COUNTS:
        assert pq.read_schema(prepared / f"{name}.parquet").equals(schema, check_metadata=False), name


def test_rows_content(prepared):
    train = pd.read_parquet(prepared / "math_lvl3to5.parquet")
    row = train.iloc[7]
    assert row["ability"] == "math"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "8"}
    assert row["prompt"][1]["content"] == "What is 7 + 1?"  # the raw question, not the templated `input`
    info = row["extra_info"]
    assert info["split"] == "train" and info["index"] == 7 and info["benchmark"] == "math_lvl3to5"
    assert list(info["answers"]) == ["8"] and info["level"] == "4" and info["subject"] == "Algebra"

    amc = pd.read_parquet(prepared / "amc.parquet")
    assert amc.iloc[42]["reward_model"]["ground_truth"] == "142"  # 142.0 -> "142"

    minerva = pd.read_parquet(prepared / "minerva.parquet")
    assert minerva.iloc[3]["reward_model"]["ground_truth"] == "3.5"  # "$3.5$" unwrapped
    assert list(minerva.iloc[3]["extra_info"]["answers"]) == ["3.5", "\\frac{7}{2}"]
    assert minerva.iloc[3]["extra_info"]["split"] == "test"


def test_prompt_is_dr_grpos_qwen_math_template(prepared):
    frame = pd.read_parquet(prepared / "math500.parquet")
    messages = [dict(m) for m in frame.iloc[0]["prompt"]]
    assert messages[0] == {"role": "system", "content": prep.QWEN_MATH_SYSTEM}
    assert chatml(messages) == drgrpo_qwen_math_template("math500 problem 0")


def test_files_are_readable_by_datasets_as_verl_reads_them(prepared, tmp_path):
    import datasets

    dataset = datasets.load_dataset("parquet", data_files=str(prepared / "minerva.parquet"), split="train",
                                    cache_dir=str(tmp_path))
    assert len(dataset) == 272
    assert dataset[0]["prompt"][0]["role"] == "system"


def test_prepared_rows_score_with_the_reward(prepared):
    from recipe_apo.reward import compute_score

    frame = pd.read_parquet(prepared / "minerva.parquet")
    row = frame.iloc[5]
    extra_info = dict(row["extra_info"])
    gt = row["reward_model"]["ground_truth"]
    assert compute_score(row["data_source"], "so \\boxed{11/2}", gt, extra_info) == 1.0
    assert compute_score(row["data_source"], "so \\boxed{6}", gt, extra_info) == 0.0


def test_count_mismatch_fails_without_writing(tmp_path, capsys):
    src = write_jsonl(tmp_path / "aime.jsonl", eval_rows("aime24", 29))
    out = tmp_path / "out"
    assert prep.main(["--out-dir", str(out), "--splits", "aime24", "--file", f"aime24={src}"]) == 1
    err = capsys.readouterr().err
    assert "29 rows, the paper uses 30" in err and "--allow-partial" in err
    assert not (out / "aime24.parquet").exists()


def test_allow_partial_writes_and_warns(tmp_path, capsys):
    src = write_jsonl(tmp_path / "aime.jsonl", eval_rows("aime24", 29))
    out = tmp_path / "out"
    assert prep.main(["--out-dir", str(out), "--splits", "aime24", "--file", f"aime24={src}", "--allow-partial"]) == 0
    captured = capsys.readouterr()
    assert "WARNING 29 rows" in captured.err
    assert "| aime24 | 29 | 30 | partial |" in captured.out
    assert len(pd.read_parquet(out / "aime24.parquet")) == 29


def test_rows_without_question_or_answer_are_dropped_and_counted(tmp_path, capsys):
    rows = eval_rows("aime24", 30) + [{"problem": "", "answer": "1"}, {"problem": "no answer", "answer": None}]
    src = write_jsonl(tmp_path / "aime.jsonl", rows)
    assert prep.main(["--out-dir", str(tmp_path), "--splits", "aime24", "--file", f"aime24={src}"]) == 0
    assert "2 rows without question or answer dropped" in capsys.readouterr().err


def test_drgrpo_checkout_layout(tmp_path):
    # datasets.save_to_disk folders as in sail-sg/understand-r1-zero/datasets
    root = tmp_path / "understand-r1-zero" / "datasets"
    layout = {
        "math_lvl3to5": "train/math_lvl3to5_8k/train", "aime24": "evaluation_suite/aime",
        "amc": "evaluation_suite/amc", "math500": "evaluation_suite/math",
        "minerva": "evaluation_suite/minerva", "olympiadbench": "evaluation_suite/olympiad_bench",
    }
    for name, folder in layout.items():
        os.makedirs(root / folder)
        rows = train_rows(COUNTS[name]) if name == "math_lvl3to5" else eval_rows(name, COUNTS[name])
        if name in ("minerva", "olympiadbench"):  # Dr. GRPO's copies name these columns problem/answer
            rows = [{"problem": r["question"], "answer": r["final_answer"]} for r in rows]
        write_arrow_stream(root / folder / "data-00000-of-00001.arrow", rows)
        (root / folder / "dataset_info.json").write_text("{}")
    out = tmp_path / "out"
    # the clone's root works as well as its datasets/ folder
    assert prep.main(["--out-dir", str(out), "--drgrpo-dir", str(root.parent)]) == 0
    olympiad = pd.read_parquet(out / "olympiadbench.parquet")
    assert olympiad.iloc[0]["prompt"][1]["content"] == "olympiadbench 0"
    assert olympiad.iloc[0]["extra_info"]["source"].startswith("sail-sg/understand-r1-zero:")


def test_math_solutions_give_their_boxed_answer(tmp_path):
    rows = [{"problem": f"p{i}", "solution": f"... so it is $\\boxed{{\\frac{{{i}}}{{2}}}}$."} for i in range(30)]
    src = write_jsonl(tmp_path / "aime.jsonl", rows)
    assert prep.main(["--out-dir", str(tmp_path), "--splits", "aime24", "--file", f"aime24={src}"]) == 0
    assert pd.read_parquet(tmp_path / "aime24.parquet").iloc[3]["reward_model"]["ground_truth"] == "\\frac{3}{2}"


def test_gsm8k_answers_are_the_number_after_hashes(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"step one\nstep two\n#### 1,{i:03d}"} for i in range(1319)]
    src = write_jsonl(tmp_path / "test.jsonl", rows)
    assert prep.main(["--out-dir", str(tmp_path), "--splits", "gsm8k_test", "--file", f"gsm8k_test={src}"]) == 0
    frame = pd.read_parquet(tmp_path / "gsm8k_test.parquet")
    assert frame.iloc[12]["reward_model"]["ground_truth"] == "1012"
    assert frame.iloc[0]["data_source"] == "gsm8k_test"


def test_unknown_columns_are_named_in_the_error(tmp_path, capsys):
    src = write_jsonl(tmp_path / "aime.jsonl", [{"text": "x", "label": "1"}] * 30)
    assert prep.main(["--out-dir", str(tmp_path), "--splits", "aime24", "--file", f"aime24={src}"]) == 1
    err = capsys.readouterr().err
    assert "no question column among ['label', 'text']" in err


def test_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        prep.main(["--splits", "nope"])
    with pytest.raises(SystemExit):
        prep.main(["--file", "aime24"])
    with pytest.raises(SystemExit):
        prep.main(["--file", "unknown=x.json"])


def test_hub_failure_says_what_to_do(monkeypatch, tmp_path, capsys):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    assert prep.main(["--out-dir", str(tmp_path), "--splits", "aime24"]) == 1
    err = capsys.readouterr().err
    assert "HuggingFaceH4/aime_2024" in err and "--file NAME=PATH" in err and "--drgrpo-dir" in err


def test_runs_as_a_script(tmp_path):
    src = write_jsonl(tmp_path / "aime.jsonl", eval_rows("aime24", 30))
    result = subprocess.run([sys.executable, SCRIPT, "--out-dir", str(tmp_path), "--splits", "aime24",
                             "--file", f"aime24={src}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[1/1] aime24" in result.stderr and "30 rows ->" in result.stderr


@pytest.mark.parametrize("name, content, said", [
    ("aime.jsonl", b"\xff\xfe{}\n", "not UTF-8 text (byte 0xff"),
    ("aime.json", b'[{"problem": "x", ', "not a JSON array of rows"),
    ("aime.jsonl", b'{"problem": "x"\n', "aime.jsonl:1: not a JSON line"),
    ("aime.parquet", b"PAR1 not a parquet file", "cannot be read (Arrow"),
    ("aime.arrow", b"not arrow at all", "cannot be read ("),
])
def test_an_unreadable_input_is_one_error_line_naming_it(tmp_path, capsys, name, content, said):
    src = tmp_path / name
    src.write_bytes(content)
    assert prep.main(["--out-dir", str(tmp_path / "out"), "--splits", "aime24", "--file", f"aime24={src}"]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and str(src) in errors[0] and said in errors[0], err
    assert "Traceback" not in err


def test_an_out_dir_that_is_a_file_is_refused_before_any_work(tmp_path, capsys):
    target = tmp_path / "a_file"
    target.write_text("x")
    with pytest.raises(SystemExit) as exit_:
        prep.main(["--out-dir", str(target), "--splits", "aime24"])
    assert exit_.value.code == 2 and "--out-dir" in capsys.readouterr().err and target.read_text() == "x"
