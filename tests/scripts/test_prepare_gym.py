"""scripts/prepare_data.py --splits arithmetic: reasoning-gym's basic_arithmetic, generated offline, in verl's layout;
and the reward its rows get (recipe_apo/reward/gym_answer.py through the recipe's compute_score)."""

import functools
import importlib.util
import json
import subprocess
import sys

import pandas as pd
import pytest
from helpers.paths import ROOT
from helpers.scripts import load_script, run_main
from hypothesis import given
from hypothesis import strategies as st

from recipe_apo.reward import compute_score
from recipe_apo.reward.gym_answer import last_number

# Skipped without reasoning-gym, found without importing it: its import (matplotlib through cellpylib) is 1.5
# CPU-seconds of every xdist worker's collection, and only the worker that runs this module needs it.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None, reason="needs reasoning-gym")
SCRIPT = ROOT / "scripts" / "prepare_data.py"
LEVELS = ("gym_add_1digit", "gym_addsub_1digit")


@functools.cache
def script():
    """scripts/prepare_data.py as a module, loaded once per process."""
    return load_script("prepare_data")


def prepare(out, *args, own_process=False):
    """The script's arithmetic split into ``out``, in this process (``run_main``: a process of its own imports
    reasoning-gym and pandas again, about 3 s each) or, ``own_process``, in a process of its own."""
    command = ["--splits", "arithmetic", "--out-dir", str(out), *args]
    if own_process:
        result = subprocess.run([sys.executable, str(SCRIPT), *command], capture_output=True, text=True)
    else:
        result = run_main(script(), *command)
    assert result.returncode == 0, result.stderr
    return {level: pd.read_parquet(out / f"{level}.parquet") for level in LEVELS}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("gym")
    return {part: prepare(root / part, "--part", part, "--seed", "5", "--size", "30")
            for part in ("train", "val", "test")}


def test_each_level_is_a_file_and_a_data_source_of_verl_rows(parts):
    for level, frame in parts["train"].items():
        assert set(frame["data_source"]) == {level}
        row = frame.iloc[0]
        prompt = list(row["prompt"])
        assert [m["role"] for m in prompt] == ["system", "user"]
        assert prompt[0]["content"] == "You are a calculator. Reply with the result only."
        assert prompt[1]["content"].startswith("Calculate ")
        assert row["reward_model"]["style"] == "rule"
        info = row["extra_info"]
        assert info["reasoning_gym"] == "basic_arithmetic" and info["split"] == "train"
        assert json.loads(info["reasoning_gym_metadata"])["source_dataset"] == "basic_arithmetic"
        assert list(frame["extra_info"].map(lambda i: i["index"])) == list(range(len(frame)))


def test_the_ground_truth_is_the_expression_evaluated(parts):
    for frame in parts["test"].values():
        for prompt, truth in zip(frame["prompt"], frame["reward_model"]):
            expression = prompt[1]["content"].removeprefix("Calculate ").rstrip(".")
            a, op, b = expression.split(" ")
            assert int(truth["ground_truth"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
            assert 0 <= int(a) <= 10 and 0 <= int(b) <= 10  # reasoning-gym's "one digit" draws 0-10


def test_the_parts_never_share_a_problem_and_a_file_never_repeats_one(parts):
    for level in LEVELS:
        questions = {part: [p[1]["content"] for p in parts[part][level]["prompt"]] for part in parts}
        for part, items in questions.items():
            assert len(items) == len(set(items)), part
        assert not set(questions["train"]) & set(questions["val"])
        assert not set(questions["train"]) & set(questions["test"])
        assert not set(questions["val"]) & set(questions["test"])


def test_the_one_digit_sums_run_out_and_say_so(tmp_path):
    # a + b with one digit each (0-10): 121 problems, of which the test part (buckets 8-9 of 10) holds about a fifth.
    result = run_main(script(), "--splits", "gym_add_1digit", "--part", "test", "--size", "500",
                      "--out-dir", tmp_path)
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(tmp_path / "gym_add_1digit.parquet")
    assert 5 < len(frame) < 50
    assert f"all {len(frame)} of part test" in result.stdout


def test_a_seed_gives_the_same_file_and_another_seed_other_problems(parts, tmp_path):
    # The module's train part (seed 5), made again by a process of its own (its own hash seed), and with another seed.
    again = prepare(tmp_path / "again", "--part", "train", "--seed", "5", "--size", "30", own_process=True)
    other = prepare(tmp_path / "other", "--part", "train", "--seed", "6", "--size", "30")["gym_addsub_1digit"]
    for level in LEVELS:
        assert parts["train"][level].to_json() == again[level].to_json(), level
    first = parts["train"]["gym_addsub_1digit"]
    assert [p[1]["content"] for p in first["prompt"]] != [p[1]["content"] for p in other["prompt"]]


@pytest.mark.parametrize("args, message", [
    (["--part", "holdout"], "invalid choice: 'holdout'"),
    (["--size", "0"], "must be between 1"),
    (["--seed", "x"], "expected a whole number"),
])
def test_bad_settings_are_one_line(tmp_path, args, message):
    result = subprocess.run([sys.executable, str(SCRIPT), "--splits", "arithmetic", "--out-dir", str(tmp_path), *args],
                            capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1]


# ---- the reward of these rows -------------------------------------------------------------------------------------
def gym_info():
    return {"reasoning_gym": "basic_arithmetic", "reasoning_gym_metadata": "{}"}


@pytest.mark.parametrize("response, truth, expected", [
    ("11", "11", 1.0),
    ("The sum of 6 and 5 is 11.", "11", 1.0),
    ("5 - 9 = -4", "-4", 1.0),                       # a sign is part of the number
    ("5 - 9 = 4", "-4", 0.0),
    ("12+5=17", "17", 1.0),
    ("The answer is 17, or maybe 18", "17", 0.0),   # the last number counts
    ("16", "6", 0.0),                                # reasoning-gym's checker would pay 0.5: only full credit counts
    ("6.0", "6", 0.0),                               # the task's checker compares the text
    ("1,234", "1234", 1.0),
    ("no number here", "6", 0.0),
    ("", "6", 0.0),
    ("\\boxed{6}", "6", 1.0),                        # a box is read as its number, not required and not paid
])
def test_the_reward_is_the_last_number_with_full_credit_from_the_tasks_checker(response, truth, expected):
    assert compute_score("gym_add_1digit", response, truth, gym_info()) == expected


def test_rows_without_the_generator_keep_the_boxed_math_rule():
    # Without extra_info naming a reasoning-gym task, "11" is no boxed answer: the maths rule scores it 0.
    assert compute_score("gym_add_1digit", "11", "11", {}) == 0.0
    assert compute_score("gym_add_1digit", "\\boxed{11}", "11", {}) == 1.0


@given(st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=5), st.sampled_from([" ", ", then ", " = ", "\n"]))
def test_the_last_number_is_the_last_integer_written(numbers, separator):
    text = "so " + separator.join(str(n) for n in numbers) + "."
    assert last_number(text) == str(numbers[-1])
