"""AGPO's per-prompt clip loss (recipe_apo/methods/agpo_dual/loss.py): verl's vanilla loss with each row's own clip."""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn
from verl.workers.config import ActorConfig

from recipe_apo.methods.agpo_dual import CLIP_COLUMN
from recipe_apo.methods.agpo_dual import LOSS as AGPO_CLIP
from recipe_apo.methods.agpo_dual.loss import NAME, compute_policy_loss_agpo_clip
from recipe_apo.methods.errors import BatchInputError, MethodConfigError
from recipe_apo.methods.loss_inputs import handed_columns


def actor(clip: float = 0.2, **extra) -> ActorConfig:
    return ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, clip_ratio=clip, clip_ratio_low=clip,
                       clip_ratio_high=clip, rollout_n=1, **extra)


def batch(seed: int = 0, rows: int = 4, length: int = 6):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, length, generator=g) * 2
    new = old + (torch.rand(rows, length, generator=g) - 0.5)  # ratios in about [0.6, 1.65]
    adv = torch.randn(rows, 1, generator=g).expand(rows, length).clone()
    mask = torch.ones(rows, length)
    mask[1, 4:] = 0
    return old, new, adv, mask


def test_the_registered_name_is_the_plugins():
    assert NAME == AGPO_CLIP and get_policy_loss_fn(NAME) is compute_policy_loss_agpo_clip


@pytest.mark.parametrize("eps", [0.05, 0.2, 0.37])
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_one_eps_for_every_row_is_verls_vanilla_loss_at_that_clip(eps, mode):
    old, new, adv, mask = batch()
    new.requires_grad_(True)
    want, want_metrics = compute_policy_loss_vanilla(old, new, adv, mask, mode, actor(eps))
    (want_grad,) = torch.autograd.grad(want, new)
    with handed_columns({CLIP_COLUMN: torch.full((4,), eps)}):
        got, metrics = compute_policy_loss_agpo_clip(old, new, adv, mask, mode, actor(0.2))
    (got_grad,) = torch.autograd.grad(got, new)
    assert got.item() == want.item() and torch.equal(got_grad, want_grad)
    assert {k: metrics[k] for k in want_metrics} == want_metrics
    assert metrics["actor/agpo_dual_clip_eps_mean"] == pytest.approx(eps)


def test_each_row_is_clipped_at_its_own_eps_by_hand():
    # one token per row, A = +1, ratio 1.3: row 0 (eps 0.2) contributes -1.2, row 1 (eps 0.4) -1.3 (unclipped)
    old = torch.zeros(2, 1)
    new = torch.full((2, 1), torch.log(torch.tensor(1.3)).item())
    adv, mask = torch.ones(2, 1), torch.ones(2, 1)
    with handed_columns({CLIP_COLUMN: torch.tensor([0.2, 0.4])}):
        loss, metrics = compute_policy_loss_agpo_clip(old, new, adv, mask, "token-mean", actor())
    assert loss.item() == pytest.approx(-(1.2 + 1.3) / 2, rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.5 and metrics["actor/agpo_dual_clip_eps_mean"] == pytest.approx(0.3)


def test_per_row_clips_equal_the_rows_computed_one_by_one():
    old, new, adv, mask = batch(seed=3)
    eps = torch.tensor([0.05, 0.1, 0.3, 0.2])
    with handed_columns({CLIP_COLUMN: eps}):
        loss, _ = compute_policy_loss_agpo_clip(old, new, adv, mask, "token-sum", actor())
    parts = [compute_policy_loss_vanilla(old[i:i + 1], new[i:i + 1], adv[i:i + 1], mask[i:i + 1], "token-sum",
                                         actor(float(eps[i])))[0] for i in range(4)]
    assert loss.item() == pytest.approx(sum(p.item() for p in parts), rel=1e-6)


def test_without_handed_clips_or_with_bad_ones_the_loss_refuses_in_one_line():
    old, new, adv, mask = batch()
    with pytest.raises(MethodConfigError, match="agpo_clip needs each prompt's clip in the batch"):
        compute_policy_loss_agpo_clip(old, new, adv, mask, "token-mean", actor())
    with handed_columns({CLIP_COLUMN: torch.full((3,), 0.2)}), \
            pytest.raises(BatchInputError, match="3 values for a micro-batch of 4"):
        compute_policy_loss_agpo_clip(old, new, adv, mask, "token-mean", actor())
    with handed_columns({CLIP_COLUMN: torch.tensor([0.2, 0.2, 1.5, 0.2])}), \
            pytest.raises(BatchInputError, match="row 2 has eps 1.5"):
        compute_policy_loss_agpo_clip(old, new, adv, mask, "token-mean", actor())
