"""The math reward (recipe_apo/reward/scorer.py): real answer formats, adversarial responses, timeouts, threads."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from recipe_apo.reward import compute_score, last_boxed_answer, normalize_answer
from recipe_apo.reward import pool as reward_pool
from recipe_apo.reward import scorer as reward


def boxed(answer):
    return f"Let me work it out step by step.\n...\nSo the final answer is $\\boxed{{{answer}}}$."


# (ground truth, model's boxed answer, expected score)
ANSWER_FORMATS = [
    # fractions and decimals
    ("\\frac{1}{2}", "0.5", 1.0),
    ("\\frac{1}{2}", "1/2", 1.0),
    ("\\frac{1}{2}", "\\dfrac{1}{2}", 1.0),
    ("\\frac{1}{2}", "\\tfrac12", 1.0),
    ("\\dfrac{7}{2}", "3.5", 1.0),
    ("\\frac{1}{2}", "\\frac{1}{3}", 0.0),
    ("-\\frac{1}{3}", "-1/3", 1.0),
    # radicals
    ("\\sqrt{2}", "\\sqrt2", 1.0),
    ("2\\sqrt{2}", "\\sqrt{8}", 1.0),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", 1.0),
    ("\\sqrt{2}", "1.414", 0.0),
    # intervals, tuples, sets, matrices
    ("(-\\infty, 3]", "(-\\infty,3]", 1.0),
    ("(-\\infty, 3]", "(-\\infty,3)", 0.0),
    ("[2,5)", "[2, 5)", 1.0),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", 1.0),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "\\left(3, \\pi/2\\right)", 1.0),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi)", 0.0),
    ("\\{1,2,3\\}", "\\{3,2,1\\}", 1.0),
    ("1,2,3", "3, 2, 1", 1.0),
    ("\\{1,2\\}", "\\{1,2,3\\}", 0.0),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", 1.0),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}2\\\\1\\end{pmatrix}", 0.0),
    # units, degrees, money
    ("5\\text{ cm}", "5", 1.0),
    ("5", "5 \\text{ cm}", 1.0),
    ("5", "5\\,\\text{cm}", 1.0),
    ("12\\text{ inches}", "12", 1.0),
    ("5\\text{ cm}", "6\\text{ cm}", 0.0),
    ("30^\\circ", "30", 1.0),
    ("90^\\circ", "90^{\\circ}", 1.0),
    ("\\$5", "5", 1.0),
    ("5", "\\$5.00", 1.0),
    # percent (MATH's convention: the sign is dropped, 0.5 is not 50%)
    ("50\\%", "50", 1.0),
    ("50", "50\\%", 1.0),
    ("50\\%", "50\\%", 1.0),
    ("50\\%", "0.5", 0.0),
    ("50\\%", "60\\%", 0.0),
    # text and multiple-choice answers
    ("\\text{(C)}", "C", 1.0),
    ("\\text{(C)}", "\\text{(C)}", 1.0),
    ("\\text{(C)}", "(D)", 0.0),
    ("\\text{Evelyn}", "\\text{Evelyn}", 1.0),
    ("\\text{Monday}", "\\text{Tuesday}", 0.0),
    ("\\text{even}", "even", 1.0),
    # signs, integers, separators, leading zeros, floats as ground truths (AMC stores 142.0)
    ("-3", "-3", 1.0),
    ("-3", "3", 0.0),
    ("-2", "- 2", 1.0),
    ("1000", "1,000", 1.0),
    ("025", "25", 1.0),
    (142.0, "142", 1.0),
    ("142.0", "142", 1.0),
    (204, "204", 1.0),
    ("10", "10.", 1.0),
    # scientific notation (Minerva)
    ("8.7 \\times 10^{8}", "8.7e8", 1.0),
    ("4.4e7", "4.4 \\times 10^7", 1.0),
    ("1 \\times 10^{-3}", "0.001", 1.0),
    ("1.5e-3", "0.0015", 1.0),
    ("8.7 \\times 10^{8}", "8.8\\times10^{8}", 0.0),
    ("9.6", "9.62", 0.0),
    # expressions and equations
    ("x^2+2x+1", "(x+1)^2", 1.0),
    ("p - q", "p-q", 1.0),
    ("p - q", "q-p", 0.0),
    ("x=2", "2", 1.0),
    ("2", "x = 2", 1.0),
    ("y = 2x+1", "2x+1", 1.0),
    ("2\\pi", "6.283185", 1.0),
    ("\\frac{1}{4-\\omega^2}", "\\frac{1}{4-\\omega^{2}}", 1.0),
    ("\\arcsin{\\frac{10}{13}}", "\\arcsin(10/13)", 1.0),
]


@pytest.mark.parametrize(("ground_truth", "answer", "expected"), ANSWER_FORMATS)
def test_answer_formats(ground_truth, answer, expected):
    assert compute_score("math500", boxed(answer), ground_truth) == expected


# (response, ground truth, expected score)
RESPONSE_SHAPES = [
    ("the answer is 3", "3", 0.0),  # no box
    ("", "3", 0.0),
    ("\\boxed{3", "3", 0.0),  # unclosed box
    ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}", 0.0),
    ("\\boxed{}", "3", 0.0),  # empty box
    ("\\boxedfoo 3", "3", 0.0),  # another command
    ("}}}} {{ stray braces, then \\boxed{3}", "3", 1.0),
    ("\\boxed 3", "3", 1.0),  # Hendrycks' unbraced form
    ("\\fbox{\\frac34}", "\\frac{3}{4}", 1.0),
    ("\\boxed{3} wait, no: \\boxed{4}", "4", 1.0),  # the LAST box counts
    ("\\boxed{3} wait, no: \\boxed{4}", "3", 0.0),
    ("\\boxed{3} and then \\boxed{", "3", 0.0),  # a truncated final box is no answer
    ("\\boxed{\\boxed{5}}", "5", 1.0),  # nested boxes
    ("\\fbox{4} \\boxed{5}", "5", 1.0),
    ("\\boxed{5} \\fbox{4}", "4", 1.0),
    ("answer \\boxed{7}", "\\boxed{7}", 1.0),  # a boxed ground truth
    ("answer \\boxed{7}", "The solution ... so $\\boxed{7}$.", 1.0),  # a whole solution as ground truth
    ("\\boxed{3}", None, 0.0),
    ("\\boxed{3}", "", 0.0),
    ("\\boxed{\ud800}", "3", 0.0),  # a lone surrogate
    ("\\boxed{3\x00}", "3", 0.0),
]


@pytest.mark.parametrize(("response", "ground_truth", "expected"), RESPONSE_SHAPES)
def test_response_shapes(response, ground_truth, expected):
    assert compute_score("math500", response, ground_truth) == expected


@pytest.mark.parametrize("solution", [None, 3, b"\\boxed{3}", ["\\boxed{3}"], {"text": "\\boxed{3}"}])
def test_non_string_response_scores_zero(solution):
    assert compute_score("math500", solution, "3") == 0.0


def test_returns_plain_float():
    score = compute_score("math500", boxed("1/2"), "\\frac{1}{2}")
    assert type(score) is float and score == 1.0


def test_alternative_answers_from_extra_info_as_parquet_gives_them():
    # Minerva lists several accepted forms; parquet hands lists back as numpy arrays.
    extra_info = {"answers": np.array(["0.01", "0.02"], dtype=object), "index": 3}
    assert compute_score("minerva", boxed("0.02"), "0.01", extra_info) == 1.0
    assert compute_score("minerva", boxed("0.03"), "0.01", extra_info) == 0.0
    assert compute_score("minerva", boxed("0.02"), np.array(["0.01", "0.02"], dtype=object)) == 1.0


def test_verl_gsm8k_rows_keep_verl_rule():
    # verl's gsm8k preprocessing asks for "#### <answer>"; its files keep working with this reward.
    assert compute_score("openai/gsm8k", "3 + 4 = 7\n#### 7", "7") == 1.0
    assert compute_score("openai/gsm8k", "3 + 4 = 7\n#### 8", "7") == 0.0
    # and rows prepared by scripts/prepare_data.py (data_source gsm8k_*) use boxes
    assert compute_score("gsm8k_test", boxed("7"), "7") == 1.0


def test_last_boxed_answer_scan_is_bounded():
    assert last_boxed_answer("\\boxed{" + "1" * 10_000 + "}") is None  # longer than MAX_ANSWER_CHARS
    assert last_boxed_answer("x \\boxed {a{b}c} y") == "a{b}c"
    assert last_boxed_answer("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"


def test_normalize_answer():
    assert normalize_answer(142.0) == "142"
    assert normalize_answer(" $50\\%$. ") == "50"
    assert normalize_answer("4.4e7") == "4.4 \\times 10^{7}"
    assert normalize_answer(None) == ""


MEGABYTE = 1_000_000
PATHOLOGICAL = [
    ("1 MB of text, then a box", "x" * MEGABYTE + " \\boxed{3}", "3", 1.0),
    ("1 MB inside an open box", "\\boxed{" + "1" * MEGABYTE, "1", 0.0),
    ("1 MB of opening braces", "\\boxed{" + "{" * MEGABYTE, "1", 0.0),
    ("1 MB of boxes", "\\boxed{1}" * (MEGABYTE // 9), "1", 1.0),
    ("deeply nested braces", "\\boxed{" + "{" * 500 + "3" + "}" * 500 + "}", "3", 0.0),
    ("deep fractions", "\\boxed{" + "\\frac{1}{" * 40 + "2" + "}" * 40 + "}", "2", 0.0),
    ("huge exponent tower", boxed("10^{10^{10}}"), "1", 0.0),
    ("huge power", boxed("9^{9^{9}}"), "1", 0.0),
    ("huge factorial", boxed("100000000!"), "1", 0.0),
    ("huge binomial", boxed("\\binom{10^{9}}{5 \\times 10^{8}}"), "1", 0.0),
    ("a thousand-digit number", boxed("9" * 999), "9", 0.0),
    ("ground truth itself pathological", boxed("1"), "10^{10^{10}}", 0.0),
]


@pytest.mark.parametrize(("label", "response", "ground_truth", "expected"), PATHOLOGICAL,
                         ids=[case[0] for case in PATHOLOGICAL])
def test_pathological_responses_return_promptly(label, response, ground_truth, expected):
    timeout = 2.0
    start = time.monotonic()
    assert compute_score("math500", response, ground_truth, timeout=timeout) == expected
    # Measured here at about 1 s for the computational ones (math-verify's own timeout, a third of the
    # budget, ends them inside the worker); the bound only says the call came back.
    assert time.monotonic() - start < timeout + 20


def test_a_worker_stuck_past_its_timeout_is_killed_and_replaced():
    # op_timeout=0 switches math-verify's own timeouts off inside the worker, so only the hard limit can
    # end (10^7)! -- the case of a computation that no signal interrupts.
    pool = reward_pool.VerifierPool(1)
    try:
        start = time.monotonic()
        assert pool.score(["1"], "(10^{7})!", timeout=1.0, op_timeout=0) == 0.0
        assert time.monotonic() - start < 15
        assert pool.kills == 1
        assert pool.score(["\\frac{1}{2}"], "0.5", timeout=10.0) == 1.0  # a fresh worker took over
    finally:
        pool.close()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_workers_do_not_outlive_their_process():
    # A trainer killed while a worker is stuck in a computation: the worker notices within about a second.
    code = textwrap.dedent(
        """
        import importlib.util, os, signal, threading, time
        from recipe_apo.reward import pool as rw
        pool = rw.VerifierPool(1)
        threading.Thread(target=pool.score, args=(["1"], "(10^{8})!", 60.0, 0), daemon=True).start()
        while not pool._all:
            time.sleep(0.05)
        time.sleep(0.5)
        print(next(iter(pool._all)).proc.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    worker_pid = int(child.stdout.split()[0])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _alive(worker_pid):
        time.sleep(0.2)
    assert not _alive(worker_pid)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_threads_share_the_workers():
    # verl calls the reward from executor threads, where math-verify's signal timeouts cannot work.
    cases = [(gt, boxed(answer), expected) for gt, answer, expected in ANSWER_FORMATS] * 2
    with ThreadPoolExecutor(max_workers=8) as executor:
        scores = list(executor.map(lambda case: compute_score("math500", case[1], case[0]), cases))
    assert scores == [expected for _, _, expected in cases]


def test_pathological_answer_in_a_thread_returns():
    result = {}

    def work():
        result["score"] = compute_score("math500", boxed("10^{10^{10}}"), "1", timeout=2.0)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and result["score"] == 0.0


def test_workers_that_cannot_start_stop_scoring_instead_of_checking_unbounded_in_the_thread(monkeypatch):
    starts = []

    class NoWorker:
        def __init__(self, memory_mb):
            starts.append(memory_mb)
            raise reward_pool.WorkerError("reward worker did not start: simulated")

    monkeypatch.setattr(reward_pool, "_Worker", NoWorker)
    monkeypatch.setattr(reward_pool, "_POOL", None)
    for _ in range(2):
        with pytest.raises(reward_pool.WorkerError, match="simulated; math-verify cannot run with its time bound"):
            compute_score("math500", boxed("0.5"), "\\frac{1}{2}")
    assert len(starts) == 1  # a failed start is not retried on every call
    # An exact match needs no worker.
    assert compute_score("math500", boxed("1/2"), "1/2") == 1.0
    monkeypatch.setattr(reward_pool, "_POOL", None)


@pytest.mark.parametrize("name, value", [
    ("RECIPE_APO_REWARD_WORKERS", "abc"), ("RECIPE_APO_REWARD_WORKERS", "0"), ("RECIPE_APO_REWARD_WORKERS", "2.5"),
    ("RECIPE_APO_REWARD_MEMORY_MB", "abc"), ("RECIPE_APO_REWARD_MEMORY_MB", "-1"),
    ("RECIPE_APO_REWARD_TIMEOUT", "abc"), ("RECIPE_APO_REWARD_TIMEOUT", "0"), ("RECIPE_APO_REWARD_TIMEOUT", "nan"),
])
def test_a_bad_environment_value_is_an_error_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(reward_pool, "_POOL", None)
    with pytest.raises(reward.RewardConfigError) as info:
        compute_score("math500", boxed("0.5"), "\\frac{1}{2}")
    assert str(info.value).startswith(f"{name}={value!r} must be") and "\n" not in str(info.value)
    monkeypatch.setattr(reward_pool, "_POOL", None)


def test_a_bad_environment_value_stops_the_reward_when_verl_loads_it():
    env = {**os.environ, "RECIPE_APO_REWARD_MEMORY_MB": "lots"}
    result = subprocess.run([sys.executable, "-c", "import recipe_apo.reward"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode != 0
    assert "RewardConfigError: RECIPE_APO_REWARD_MEMORY_MB='lots' must be an integer >= 0" in result.stderr


@pytest.mark.parametrize("timeout", ["soon", 0, -1, float("inf")])
def test_a_bad_timeout_in_reward_kwargs_is_an_error_naming_it(timeout):
    with pytest.raises(reward.RewardConfigError, match="reward_kwargs.timeout"):
        compute_score("math500", boxed("0.5"), "\\frac{1}{2}", timeout=timeout)


def test_under_load_no_check_outlasts_the_timeout_and_benign_answers_still_score(monkeypatch):
    """Ten threads, two workers, hostile answers among benign ones: each answer's check (what ``timeout``
    bounds) ends within it; calls wait for a free worker in turn; the benign answers keep their right scores."""
    monkeypatch.setenv("RECIPE_APO_REWARD_WORKERS", "2")
    monkeypatch.setattr(reward_pool, "_POOL", None)
    timeout = 2.0
    hostile = [("1", boxed("9^{9^{9}}"), 0.0), ("1", boxed("10^{10^{10}}"), 0.0), ("1", boxed("(10^8)!"), 0.0)] * 2
    benign = [(gt, boxed(answer), expected) for gt, answer, expected in ANSWER_FORMATS]
    cases = hostile + benign
    reward_pool._pool().score(["1"], "1", timeout)  # start-up is not what is measured
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=10) as executor:
        scores = list(executor.map(lambda c: compute_score("math500", c[1], c[0], timeout=timeout), cases))
    elapsed = time.monotonic() - started
    assert scores == [expected for _, _, expected in cases]
    assert reward_pool._pool().longest_check_s <= timeout + 0.5
    # Six hostile answers on two workers: at most three in turn, each ended at the timeout.
    assert elapsed <= 3 * timeout + 10
    reward_pool.shutdown()
    monkeypatch.setattr(reward_pool, "_POOL", None)


def test_errors_inside_score_to_zero(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(reward, "_verify", broken)
    assert compute_score("math500", boxed("0.5"), "\\frac{1}{2}") == 0.0


def test_verl_loads_it_as_a_custom_reward_function():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": "pkg://recipe_apo.reward", "name": "compute_score",
                                               "reward_kwargs": {"timeout": 5}}}}
    )
    fn = get_custom_reward_fn(config)
    # the keyword call of verl's naive reward manager
    assert fn(data_source="aime24", solution_str=boxed("25"), ground_truth="025",
              extra_info={"num_turns": None, "rollout_reward_scores": {}}) == 1.0
