"""The testbed's group filter at its cap (``MethodRun.filter_groups``), on scripted rounds: where the recipe's
trainer stops the run (tests/integration/test_refill_cap.py), the testbed trains on what it has, as its setting
declares (``FilterGroups.max_num_gen_batches``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from recipe_apo.testbed.train import MethodRun

GROUP = 2
SOLVED, SIGNAL = (1.0, 1.0), (1.0, 0.0)


def batch_of(groups, first: int):
    """A round of ``len(groups)`` prompts, ``GROUP`` one-token responses each, with the groups' rewards."""
    rewards = torch.tensor([r for group in groups for r in group]).reshape(-1, 1)
    uids = np.array([f"p{first + i}" for i in range(len(groups)) for _ in range(GROUP)], dtype=object)
    batch = {"uid": uids, "token_level_rewards": rewards, "response_mask": torch.ones_like(rewards)}
    return batch, torch.zeros_like(rewards), None


def filtered(first_round, refills, count: int, cap: int):
    """The round ``MethodRun.filter_groups`` trains on, with ``refills`` as the rounds its refills draw, and what
    it recorded."""
    script = iter(refills)
    records: dict[str, float] = {}
    run = SimpleNamespace(
        group=GROUP, refill_batches=cap, refills=None, host=SimpleNamespace(dropped_tokens=0.0),
        task=SimpleNamespace(sample_prompts=lambda n, stream: (torch.zeros(n, 1), torch.zeros(n))),
        sample_round=lambda step, prompts, k, refill: batch_of(next(script), 100),
        record=lambda key, value: records.__setitem__(key, value))
    batch, _, _ = MethodRun.filter_groups(run, 1, *batch_of(first_round, 0), count)
    return batch, records, run.host.dropped_tokens


def test_a_round_that_cannot_fill_trains_on_its_last_batch_after_the_cap():
    batch, records, dropped = filtered([SOLVED] * 4, [[SOLVED] * 4] * 10, count=4, cap=3)
    assert records == {"filter_groups/gen_batches": 3, "filter_groups/filled_share": 0.0}
    assert batch["uid"].tolist() == [f"p{100 + i // 2}" for i in range(8)]  # the third batch, as it came
    assert dropped == 16.0  # 3 batches of 8 one-token responses generated, 8 trained on


def test_a_round_short_at_the_cap_trains_on_the_groups_with_a_signal_it_has():
    batch, records, _ = filtered([SOLVED, SIGNAL, SOLVED, SOLVED], [[SOLVED, SOLVED, SIGNAL, SOLVED]] * 10,
                                 count=4, cap=2)
    assert records == {"filter_groups/gen_batches": 2, "filter_groups/filled_share": 0.5}
    assert batch["uid"].tolist() == ["p1.1", "p1.1", "p102.2", "p102.2"]
    assert batch["token_level_rewards"].flatten().tolist() == [1.0, 0.0, 1.0, 0.0]


def test_a_round_that_fills_within_the_cap_takes_its_first_groups_with_a_signal_and_leaves_the_surplus():
    batch, records, _ = filtered([SIGNAL, SOLVED, SIGNAL, SOLVED], [[SIGNAL] * 4] * 10, count=4, cap=10)
    assert records == {"filter_groups/gen_batches": 2, "filter_groups/filled_share": 1.0}
    assert batch["uid"].tolist() == ["p0.1", "p0.1", "p2.1", "p2.1", "p100.2", "p100.2", "p101.2", "p101.2"]
