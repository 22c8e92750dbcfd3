"""The second task family (task=modsum): digit sums mod K, where difficulty is the chance of a lucky success."""

import pytest
import torch
from helpers.testbed_tiny import TINY_RUN
from hydra import initialize_config_module

from recipe_apo.testbed.modsum import FIRST_DIGIT, ModSumTask
from recipe_apo.testbed.task import EOS, FILL, PAD, SEP


@pytest.fixture(scope="module")
def hydra_ctx():
    import recipe_apo.testbed.configs  # noqa: F401  (stores the presets' defaults)

    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        yield


def _task(**kw):
    return ModSumTask(**{"moduli": (2, 4, 8, 16, 32), "max_response_length": 8, "filler_mean": 0.0,
                         "prefix_max": 3, **kw})


def _d(*digits):
    return [FIRST_DIGIT + d for d in digits]


def test_the_verifier_by_hand():
    task = _task()
    # Vocabulary: 4 special tokens, 10 digits, then one token per modulus (2, 4, 8, 16, 32), then 32 targets.
    assert (task.first_modulus, task.first_target, task.vocab_size) == (14, 19, 51)
    prompt = torch.tensor([[task.first_modulus + 1, task.first_target + 3, SEP]])  # K = 4, t = 3
    prompts, k = prompt.expand(7, -1), torch.full((7,), 4)
    responses = torch.tensor([
        _d(1, 2) + [EOS] + [PAD] * 5,                  # 3 mod 4 = 3: right
        _d(1) + [FILL] + _d(2) + [EOS] + [PAD] * 4,    # fillers are ignored: right
        _d(3, 3) + [EOS] + [PAD] * 5,                  # 6 mod 4 = 2: wrong
        _d(9, 9, 9, 9, 9, 9, 9, 9),                    # 72 mod 4 = 0, and cut at L0: wrong
        [EOS] + [PAD] * 7,                             # no digit: wrong
        _d(3) + [task.first_target] + [EOS] + [PAD] * 5,  # a prompt token in the answer: malformed
        _d(7, 9, 9, 9, 9, 9, 9) + [EOS],               # 61 mod 4 = 1: wrong, ended at the last slot
    ])
    scored = task.score(prompts, k, responses)
    assert scored["reward"].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert scored["length"].tolist() == [3, 4, 3, 8, 1, 3, 8]
    assert scored["cut"].tolist() == [False, False, False, True, False, False, False]
    assert scored["fillers"].tolist() == [0, 1, 0, 0, 0, 1, 0]


def test_exactly_one_target_of_k_accepts_any_well_formed_answer():
    # What makes a random success 1/K: a digit string has one sum, which matches exactly one t in [0, K).
    task = _task(max_response_length=12)
    gen = torch.Generator().manual_seed(0)
    digits = torch.randint(0, 10, (200, 11), generator=gen)
    lengths = torch.randint(1, 12, (200,), generator=gen)
    pos = torch.arange(12).unsqueeze(0)
    body = torch.cat([digits + FIRST_DIGIT, torch.zeros(200, 1, dtype=torch.int64)], dim=1)
    responses = torch.where(pos < lengths.unsqueeze(1), body, torch.full_like(body, PAD))
    responses = torch.where(pos == lengths.unsqueeze(1), torch.full_like(body, EOS), responses)
    for index, K in enumerate(task.moduli):
        hits = torch.zeros(200)
        for t in range(K):
            prompts = torch.tensor([[task.first_modulus + index, task.first_target + t, SEP]]).expand(200, -1)
            reward = task.score(prompts, torch.full((200,), K), responses)["reward"]
            # The expected target, by an independent formula: the sum of the written digits mod K.
            sums = torch.stack([digits[i, : lengths[i]].sum() for i in range(200)])
            assert torch.equal(reward.bool(), sums % K == t)
            hits += reward
        assert torch.equal(hits, torch.ones(200))


def test_demonstrations_are_correct_and_as_short_as_the_rule_says():
    task = _task(max_response_length=12)
    gen = torch.Generator().manual_seed(1)
    prompts, k = task.sample_prompts(2000, gen)
    assert set(k.tolist()) == set(task.moduli)
    targets = task.targets(prompts)
    assert ((targets >= 0) & (targets < k)).all()
    demos, fits = task.demonstrations(prompts, k, gen)
    assert fits.all()  # max_digits (3 + 3 + 1) + end token fit in 12
    scored = task.score(prompts, k, demos)
    assert (scored["reward"] == 1.0).all() and not scored["cut"].any()
    # By hand: K = 32, t = 30 after an empty prefix is 30 = 9 + 9 + 9 + 3: nines, then the rest.
    one = torch.tensor([[task.first_modulus + 4, task.first_target + 30, SEP]])
    for _ in range(50):  # some draw has an empty prefix
        demo, _ = task.demonstrations(one, torch.tensor([32]), gen)
        content = [int(x) - FIRST_DIGIT for x in demo[0] if FIRST_DIGIT <= int(x) < FIRST_DIGIT + 10]
        assert sum(content) % 32 == 30
        if len(content) == 4 and content[:3] == [9, 9, 9]:
            assert content[3] == 3
            break
    else:
        pytest.fail("no demonstration with an empty prefix in 50 draws")


@pytest.mark.parametrize("bad, match", [
    ({"moduli": (1, 4)}, r"task.moduli=\[1, 4\]: must be distinct whole numbers >= 2"),
    ({"moduli": (4, 4)}, r"task.moduli=\[4, 4\]: must be distinct whole numbers >= 2"),
    ({"prefix_max": -1}, "task.prefix_max=-1: must be >= 0"),
    ({"max_response_length": 7}, r"data.max_response_length=7: must leave room for the longest demonstration"),
])
def test_bad_settings_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        _task(**bad)


def test_a_modsum_testbed_run_and_its_checks(hydra_ctx, tmp_path):
    from recipe_apo.testbed.runner import run_testbed

    summary = run_testbed(["seeds=[0]", *TINY_RUN, "task=modsum"], tmp_path, show_progress=False,
                          entries={"grpo": ["method=grpo"], "apo": ["method=apo"]})
    assert summary["config"]["task"]["name"] == "modsum"
    report = (tmp_path / "report.md").read_text()
    assert "scenario `default`, task `modsum`)" in report.splitlines()[0]
    assert "Task: digit sums mod K in {2, 4, 8, 16, 32}. 4 rounds of 8 prompts" in report
    assert set(summary["aggregate"]) == {"grpo", "apo"}
    assert 0 <= summary["aggregate"]["apo"]["success_final"]["mean"] <= 1
    with pytest.raises(ValueError, match=r"task.moduli=\[1,2\]: a non-empty list of distinct whole numbers in \[2, "):
        run_testbed(["seeds=[0]", *TINY_RUN, "task=modsum", "task.moduli=[1,2]", "method=grpo"], tmp_path,
                    show_progress=False)
    with pytest.raises(ValueError, match=r"task.moduli=5: a non-empty list of distinct whole numbers"):
        run_testbed(["seeds=[0]", *TINY_RUN, "task=modsum", "task.moduli=5", "method=grpo"], tmp_path,
                    show_progress=False)
    with pytest.raises(ValueError, match=r"task.name=sort: one of reverse, modsum"):
        run_testbed(["seeds=[0]", *TINY_RUN, "task.name=sort", "method=grpo"], tmp_path, show_progress=False)
    # The task is shared by the methods of a seed: a method's own entry may not change it.
    with pytest.raises(ValueError, match="methods.apo sets task=modsum"):
        run_testbed(["seeds=[0]", *TINY_RUN], tmp_path, show_progress=False,
                    entries={"apo": ["method=apo", "task=modsum"]})
