"""The unbiased pass@k (Chen et al. 2021) and the validation metrics that log it beside verl's ``best@k``.

Values are worked out by hand in the comments, or counted by enumerating every subset of k samples.
"""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipe_apo.integration.pass_at_k import ks_beside_best, pass_at_k, validation_metrics


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 2) == 0.5  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 4) == 1.0  # every draw of all four holds the right one (verl #7240 reads 0.684)
    assert pass_at_k(4, 1, 1) == 0.25  # pass@1 is the fraction right
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(4, 2, 3) == 1.0  # two wrong cannot fill a draw of three
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 8, 1) == 1.0
    # vectorized over problems: [0 of 4, 1 of 4, 2 of 5] at k = 3: 0, 1 - C(3,3)/C(4,3) = 3/4, 9/10
    np.testing.assert_allclose(pass_at_k([4, 4, 5], [0, 1, 2], 3), [0.0, 0.75, 0.9])


def test_pass_at_k_stays_exact_where_the_binomials_overflow_a_float():
    # C(3000, 1500) ~ 1e901: the ratio of binomials in floats would be inf / inf. 1 - C(2990, 1500)/C(3000, 1500)
    # exactly, from Python's integers:
    exact = 1 - Fraction(math.comb(2990, 1500), math.comb(3000, 1500))
    assert pass_at_k(3000, 10, 1500) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(10**6, 1, 2) == pytest.approx(2e-6, rel=1e-9)  # 1 - (n-1)(n-2) / (n (n-1)) = 2/n


def brute_force(n: int, c: int, k: int) -> Fraction:
    """The share of the C(n, k) draws of k of n samples (the first c right) that hold a right one."""
    draws = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in draw) for draw in draws), len(draws))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_pass_at_k_is_the_share_of_draws_holding_a_right_sample(data):
    n = data.draw(st.integers(1, 10))
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    assert pass_at_k(n, c, k) == pytest.approx(float(brute_force(n, c, k)), abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 8)), min_size=1, max_size=6), st.integers(1, 8))
def test_pass_at_k_over_a_batch_is_each_problems_own(problems, k):
    problems = [(n, min(c, n)) for n, c in problems if n >= k]
    if not problems:
        return
    n, c = np.array(problems).T
    np.testing.assert_allclose(pass_at_k(n, c, k), [float(brute_force(*p, k)) for p in problems], atol=1e-12)


def test_pass_at_k_refuses_what_it_cannot_estimate():
    with pytest.raises(ValueError, match=r"pass@3 needs at least 3 samples per problem, got 2"):
        pass_at_k([4, 2], [1, 1], 3)
    with pytest.raises(ValueError, match=r"pass@0: k must be 1 or more"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match=r"pass@2: 5 right of 4 samples"):
        pass_at_k(4, 5, 2)


def test_the_ks_are_verls_best_at_ks():
    assert ks_beside_best(1) == [] and ks_beside_best(2) == [2]
    assert ks_beside_best(4) == [2, 4] and ks_beside_best(6) == [2, 4, 6] and ks_beside_best(8) == [2, 4, 8]


def test_validation_metrics_by_hand():
    # source "a": problems u (1 right of 4) and v (2 of 4); source "b": w (0 of 2)
    sources = ["a"] * 8 + ["b"] * 2
    uids = ["u"] * 4 + ["v"] * 4 + ["w"] * 2
    acc = [1, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    infos = {"reward": [float(x) for x in acc], "acc": [bool(x) for x in acc],
             "length": [3, 1, 2, 5, 4, 4, 1, 2, 7, 7],  # not right/wrong: no pass@k
             "pred": ["1"] * 10,  # text: none either
             "truncated": [0, 1, 0, 0, 0, 0, 1, 0, 0, 0],  # 0/1 but not an answer: none
             "score": [float(x) for x in acc]}
    metrics = validation_metrics(sources, uids, infos)
    # a: pass@2 (1/2 + (1 - C(2,2)/C(4,2) = 5/6)) / 2 = 2/3; pass@4 (1 + 1) / 2 = 1. b: pass@2 0.
    assert metrics == pytest.approx({
        "val-aux/a/acc/pass@2/mean": 2 / 3, "val-core/a/acc/pass@4/mean": 1.0, "val-core/b/acc/pass@2/mean": 0.0,
        "val-aux/a/reward/pass@2/mean": 2 / 3, "val-aux/a/reward/pass@4/mean": 1.0,
        "val-aux/b/reward/pass@2/mean": 0.0,
        "val-aux/a/score/pass@2/mean": 2 / 3, "val-aux/a/score/pass@4/mean": 1.0, "val-aux/b/score/pass@2/mean": 0.0,
    })


def test_validation_metrics_without_acc_put_the_reward_in_core_and_skip_graded_sources():
    # "graded" has a reward of 0.5: pass@k does not apply there; "plain" is right/wrong
    sources = ["plain"] * 3 + ["graded"] * 2
    metrics = validation_metrics(sources, ["p"] * 3 + ["g"] * 2, {"reward": [0.0, 1.0, 0.0, 0.5, 1.0]})
    # one right of 3: pass@2 = 1 - C(2,2)/C(3,2) = 2/3, pass@3 = 1; verl logs best@2 and best@3 for n = 3
    assert metrics == pytest.approx({"val-aux/plain/reward/pass@2/mean": 2 / 3,
                                     "val-core/plain/reward/pass@3/mean": 1.0})
    assert validation_metrics(["s"] * 2, ["p"] * 2, {"reward": [float("nan"), 1.0]}) == {}
    assert validation_metrics(["s"], ["p"], {"reward": [1.0]}) == {}  # one sample: no k (verl logs no best@k)


def test_validation_metrics_over_problems_with_different_sample_counts_and_failed_sessions():
    # u: 1 right of 2 given, None for a third (no value); v: 1 of 4. pass@2 over both: (1 + 1/2) / 2 = 3/4;
    # pass@4 over v alone (u has 2 samples): 1
    sources = ["s"] * 7
    uids = ["u"] * 3 + ["v"] * 4
    acc = [1, 0, None, 1, 0, 0, 0]
    assert validation_metrics(sources, uids, {"acc": acc}) == pytest.approx(
        {"val-aux/s/acc/pass@2/mean": 0.75, "val-core/s/acc/pass@4/mean": 1.0})
    # verl's expected_acc_counts: 4 asked for u, 4 for x (every session of x failed): u is 1 right of 4
    # (pass@2 1/2, pass@4 1), v as before (1/2, 1), x 0 of 4 (0, 0): pass@2 1/3, pass@4 2/3
    metrics = validation_metrics(sources, uids, {"acc": acc, "reward": [float(a or 0) for a in acc]},
                                 {("s", "u"): 4, ("s", "v"): 4, ("s", "x"): 4})
    assert metrics["val-aux/s/acc/pass@2/mean"] == pytest.approx(1 / 3)
    assert metrics["val-core/s/acc/pass@4/mean"] == pytest.approx(2 / 3)
    assert metrics["val-aux/s/reward/pass@4/mean"] == 1.0  # the failed sessions count against acc alone, as in verl


def test_the_recipes_trainer_logs_pass_at_k_beside_verls_best_at_k():
    """verl #7240: one right answer of four. verl's bootstrapped best@4 reads about 1 - (3/4)^4 = 0.684; every
    draw of four of the four samples holds the right one: pass@4 is 1, pass@2 is 1/2 (best@2: 1 - (3/4)^2)."""
    from recipe_apo.integration.trainer import RecipeSyncTrainer

    trainer = object.__new__(RecipeSyncTrainer)  # the hook reads nothing of the trainer's state
    infos = {"reward": [1.0, 0.0, 0.0, 0.0], "acc": [1.0, 0.0, 0.0, 0.0]}
    metrics = trainer._val_metrics_update(["math"] * 4, ["q"] * 4, infos, [], expected_acc_counts={("math", "q"): 4})
    assert metrics["val-core/math/acc/best@4/mean"] == pytest.approx(1 - 0.75**4, abs=0.04)  # verl's own
    assert metrics["val-core/math/acc/pass@4/mean"] == 1.0
    assert metrics["val-aux/math/acc/best@2/mean"] == pytest.approx(1 - 0.75**2, abs=0.04)
    assert metrics["val-aux/math/acc/pass@2/mean"] == 0.5
    assert metrics["val-core/math/acc/mean@4"] == 0.25


def test_every_mode_of_the_recipes_trainer_logs_it():
    """verl 0.9.1's three V1 modes validate through ``PPOTrainer._validate``, which ends in
    ``self._val_metrics_update``: none of verl's mode classes overrides either, so the recipe's hook is theirs."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from recipe_apo.integration.trainer import (
        RecipeColocateAsyncTrainer,
        RecipeHooks,
        RecipeSeparateAsyncTrainer,
        RecipeSyncTrainer,
    )

    for trainer_cls in (RecipeSyncTrainer, RecipeColocateAsyncTrainer, RecipeSeparateAsyncTrainer):
        assert trainer_cls._val_metrics_update is RecipeHooks._val_metrics_update
        verl_cls = trainer_cls.__mro__[2]
        assert verl_cls.__module__.startswith("verl.") and "_val_metrics_update" not in verl_cls.__dict__
        assert "_validate" not in verl_cls.__dict__ and hasattr(PPOTrainer, "_validate")
