"""One mini-batch, one optimizer step: the same update whatever the number of data-parallel ranks and however the
mini-batch is cut into micro-batches, for APO's loss and every preset's, through verl's own FSDP2 engine.

tests/e2e/fsdp_cpu_steps.py builds verl's ``TrainingWorker`` (FSDP2, float32, SGD, clipping out of reach) once
with 1 rank and once with 2 (gloo, one process each) and trains one 8-row mini-batch with verl's ``ppo_loss``, in
the layout verl's V1 trainer hands its workers (jagged tensors from TransferQueue), from the same initial weights
for every (loss, cut): fixed micro-batches of 1, 2 and all of a rank's rows, and ``use_dynamic_bsz`` with token
budgets of 14 and 23. Reference: 1 rank, one micro-batch. The batch has responses of 1 to 9 tokens, advantages of
both signs and old log-probs away from the current ones (ratios spread over about exp(+-1)), so PPO's clip and
APO's gate act.

Two of verl's losses normalise per micro-batch and are the negative controls: ``vanilla`` with
``seq-mean-token-sum-norm`` and no ``loss_scale_factor`` (verl divides by the micro-batch's padded width), and
``geo_mean`` (a plain mean over the micro-batch's sequences). The presets avoid both (docs/internals.md,
"Gradient invariance across ranks, micro-batches and dynamic batch sizes").
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

PRESETS = ("apo", "drgrpo", "grpo", "codapo")
REFERENCE = (1, "micro8")  # 1 rank, the whole mini-batch in one micro-batch
# float32: the weights after the step agree to 1e-6 of each tensor's scale, the updates to 1e-6 of their norm.
# Measured: at most 3.9e-7 and 2.7e-7 (summation order: micro-batch accumulation, gloo's reduce-scatter).
TOLERANCE = 1e-6
# A loss that depends on the cut misses the reference by at least this much (measured: 0.22 and up).
FAR_OFF = 1e4 * TOLERANCE


@dataclass
class Run:
    world_size: int
    result: dict
    params: dict

    @classmethod
    def load(cls, folder: Path) -> "Run":
        result = json.loads((folder / "result.json").read_text())
        return cls(result["world_size"], result, torch.load(folder / "params.pt"))

    @property
    def steps(self) -> dict:
        return self.result["invariance"]["steps"]

    def cuts(self, loss: str) -> list[str]:
        return [key.split("/", 1)[1] for key in self.steps if key.split("/", 1)[0] == loss]


@pytest.fixture(scope="module")
def runs(fsdp_steps) -> dict[int, Run]:
    # Both runs at once (3 processes): most of each is importing torch and verl, which overlaps well.
    with ThreadPoolExecutor(max_workers=2) as pool:
        folders = list(pool.map(fsdp_steps.run, (1, 2)))
    return {run.world_size: run for run in map(Run.load, folders)}


def _flat(params: dict, minus: dict) -> torch.Tensor:
    return torch.cat([(params[name] - minus[name]).flatten() for name in params])


def weight_gap(params: dict, reference: dict) -> float:
    """max over tensors of max|p - p_ref| / max|p_ref|: the weights' difference at each tensor's own scale."""
    return max(((params[n] - reference[n]).abs().max() / reference[n].abs().max()).item() for n in params)


def update_gap(params: dict, reference: dict, initial: dict, factor: float = 1.0) -> float:
    """||u - factor * u_ref|| / ||factor * u_ref||, u = this step's update of all weights together."""
    update, expected = _flat(params, initial), factor * _flat(reference, initial)
    return ((update - expected).norm() / expected.norm()).item()


def gaps(runs: dict[int, Run], loss: str) -> dict[tuple[int, str], tuple[float, float]]:
    """(world size, cut) -> (weight gap, update gap) against the reference, for every step of ``loss``."""
    reference = runs[REFERENCE[0]].params[f"{loss}/{REFERENCE[1]}"]
    initial = runs[REFERENCE[0]].params["initial"]
    return {
        (size, cut): (weight_gap(run.params[f"{loss}/{cut}"], reference),
                      update_gap(run.params[f"{loss}/{cut}"], reference, initial))
        for size, run in runs.items()
        for cut in run.cuts(loss)
        if (size, cut) != REFERENCE
    }


def test_both_runs_start_from_the_same_weights(runs):
    one, two = runs[1].params["initial"], runs[2].params["initial"]
    assert one.keys() == two.keys() and len(one) == 27  # a 2-layer Qwen2 with q/k/v biases and an untied head
    assert all(torch.equal(one[name], two[name]) for name in one)


def test_the_cuts_are_what_they_say(runs):
    """The micro-batches verl's splitter made, as the engine used them (recorded per rank)."""
    for run in runs.values():
        rows = run.result["invariance"]["rows_per_rank"]
        assert rows == 8 // run.world_size
        for key, step in run.steps.items():
            splits = step["splits"]
            assert len(splits) == run.world_size and all(len(calls) == 1 for calls in splits), (key, splits)
            per_rank = [calls[0] for calls in splits]
            assert all(sum(sizes) == rows for sizes in per_rank), (key, per_rank)
            cut = key.split("/", 1)[1]
            if cut.startswith("micro"):
                size = int(cut[len("micro"):])
                assert all(sizes == [size] * (rows // size) for sizes in per_rank), (key, per_rank)
            else:
                # A token budget below every rank's share: several micro-batches on every rank.
                assert all(len(sizes) >= 2 for sizes in per_rank), (key, per_rank)
        # The 14-token budget cuts every rank's share into micro-batches of different sizes (measured: 1,1,2,2,2
        # with 1 rank; 1,2,1 and 1,1,2 with 2).
        for loss in PRESETS:
            assert all(len(set(calls[0])) >= 2 for calls in run.steps[f"{loss}/tokens14"]["splits"]), run.world_size


def test_the_batch_reaches_the_clip_and_the_gate(runs):
    """Ratios far off 1 on both sides: the invariance is shown where the losses' nonlinearities act."""
    metrics = {loss: runs[1].steps[f"{loss}/micro8"]["metrics"] for loss in PRESETS}
    tokens = 37  # the 8 responses' lengths: 9 + 2 + 4 + 3 + 7 + 1 + 6 + 5

    def count(loss, name):
        return metrics[loss][name][0] * tokens

    for loss in ("drgrpo", "grpo", "codapo"):
        assert count(loss, "actor/pg_clipfrac") == pytest.approx(12), (loss, metrics[loss])  # PPO's clip active
    assert count("apo", "actor/apo_ratio_out_share") == pytest.approx(29), metrics["apo"]  # |r - 1| > 0.2
    assert count("apo", "actor/apo_gate_low_share") == pytest.approx(1), metrics["apo"]  # gate weight < 0.5
    assert metrics["apo"]["actor/apo_gate_weight"][0] == pytest.approx(0.893, abs=1e-3)  # mean w(r)


@pytest.mark.parametrize("loss", PRESETS)
def test_a_preset_loss_gives_the_same_update_for_every_cut_and_rank_count(runs, loss):
    initial = runs[1].params["initial"]
    reference = runs[1].params[f"{loss}/micro8"]
    # The step moves the weights by 3-12% of their norm (measured): a tolerance of 1e-6 on the weights then
    # resolves a gradient off by a few 1e-5 of itself, and the update gap one off by 1e-6.
    moved = (_flat(reference, initial).norm() / torch.cat([p.flatten() for p in initial.values()]).norm()).item()
    assert 0.01 < moved < 0.2, moved
    found = gaps(runs, loss)
    assert len(found) == 5 + 5 - 1  # micro 1/2/whole and two token budgets, for 1 and 2 ranks, less the reference
    off = {where: gap for where, gap in found.items() if max(gap) > TOLERANCE}
    assert not off, f"{loss}: (weight gap, update gap) above {TOLERANCE}: {off}"


def test_verl_norm_mode_without_loss_scale_factor_depends_on_the_cut(runs):
    """verl's seq-mean-token-sum-norm with loss_scale_factor unset divides each micro-batch's loss by that
    micro-batch's padded width, its longest response (agg_loss's fallback, loss_mask.shape[-1]), so the update
    depends on the micro-batches and on the ranks' shares. Refused by the recipe's validation; apo and drgrpo set
    L0."""
    found = gaps(runs, "vanilla_norm_no_l0")
    # Every cut, including 2 ranks with one micro-batch each (the second rank's longest response is 7, not 9).
    near = {where: gap for where, gap in found.items() if min(gap) < FAR_OFF}
    assert not near, near


def test_geo_mean_update_grows_with_the_number_of_micro_batches(runs):
    """verl's geo_mean averages its sequences with torch.mean over each micro-batch and ignores verl's global
    batch info, so k equal micro-batches per rank give k times the update; dynamic cuts give something else."""
    initial = runs[1].params["initial"]
    reference = runs[1].params["geo_mean/micro8"]
    for size, run in runs.items():
        rows = run.result["invariance"]["rows_per_rank"]
        for cut in run.cuts("geo_mean"):
            params = run.params[f"geo_mean/{cut}"]
            if cut.startswith("micro"):
                k = rows // int(cut[len("micro"):])
                # k == 1 for 2 ranks with one micro-batch each: FSDP's mean over ranks then equals the global mean.
                assert update_gap(params, reference, initial, factor=k) < TOLERANCE, (size, cut, k)
            else:
                assert update_gap(params, reference, initial) > FAR_OFF, (size, cut)
