"""R2PO in the testbed, the second adapter of its runtime: the policy gains the rollout head, rounds alternate their
phases as the schedule says, a head round moves the head alone and a policy round everything but the head, the
optimizer restarts at each phase's first round, and the evaluation samples the base head (the model users keep)."""

from __future__ import annotations

import pytest
import torch
from helpers.testbed_tiny import TINY_RUN
from hydra import initialize_config_module


@pytest.fixture(scope="module")
def hydra_ctx():
    import recipe_apo.testbed.configs  # noqa: F401  (stores the settings' defaults that testbed.yaml composes)

    with initialize_config_module(config_module="recipe_apo.conf", version_base="1.3"):
        yield


def _run(overrides):
    from hydra import compose

    from recipe_apo.testbed.runner import check_method
    from recipe_apo.testbed.train import MethodRun, prepare_seed

    cfg = compose(config_name="testbed", overrides=[*TINY_RUN, "method=r2po", *overrides])
    check_method(cfg)  # the preset's verl settings (FSDP2, external_lib, ...) pass the testbed's checks
    return MethodRun(cfg, prepare_seed(cfg, 0))


def _state(run):
    return {name: t.detach().clone() for name, t in run.policy.named_parameters()}


def test_rounds_alternate_phases_and_move_their_own_parameters(hydra_ctx):
    run = _run(["algorithm.r2po.head_steps=2", "algorithm.r2po.policy_steps=1"])
    assert run.policy.residual is not None and run.policy.logits_head == "roll"
    assert run.reference.residual is None  # the KL's reference: the initial policy's base head
    head = {n for n, _ in run.policy.named_parameters() if n.startswith("residual.")}
    adam_steps = []
    for r, phase in enumerate((0, 0, 1, 0)):
        before = _state(run)
        run.train_round(r)
        assert run.history["r2po/phase"][-1] == phase
        after = _state(run)
        moved = {n for n in before if not torch.equal(before[n], after[n])}
        assert moved == (head if phase == 0 else set(before) - head), r
        adam_steps.append({float(s["step"]) for s in run.optimizer.state.values()})
        assert len(run.optimizer.state) == (len(head) if phase == 0 else len(before) - len(head)), r
    updates = adam_steps[0].pop()  # optimizer steps a round (its mini-batches)
    assert updates >= 1 and adam_steps[1:] == [{2 * updates}, {updates}, {updates}]  # restarted at each phase


def test_the_evaluation_samples_the_base_head(hydra_ctx):
    from recipe_apo.testbed.train import _EVAL_SAMPLING, evaluate, generator

    run = _run([])
    with torch.no_grad():
        for layer in run.policy.residual.children():
            layer.weight.normal_(0, 0.5)  # a residual that changes what pi_roll samples
    setup = run.setup
    args = (run.task, setup.eval_prompts, setup.eval_k, 4)
    with_head = evaluate(run.policy, *args, generator(0, _EVAL_SAMPLING))
    run.policy.residual = None
    torch.testing.assert_close(with_head, evaluate(run.policy, *args, generator(0, _EVAL_SAMPLING)))
