"""The actor's update passes log how far pi_roll is from pi_base: ``recipe_apo.integration.model_classes`` wraps
verl's ``forward_step`` (``verl_worker_access.with_heads``) so that a pass naming a logits head, in an update,
measures the model's head gap on the micro-batch's response tokens (their lengths read as verl reads them) and adds
it to verl's metrics of the pass; forward-only passes and a pass that names no head are left as verl runs them."""

from __future__ import annotations

import types

import pytest
import torch
from tensordict import TensorDict

from recipe_apo.methods.r2po.model import HEAD_KL, HEAD_LOGIT_GAP


@pytest.fixture(scope="module")
def model(tiny_task, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from recipe_apo.methods.r2po.model import add_rollout_head, register_hf_models

    path = add_rollout_head(tiny_task["model"], tmp_path_factory.mktemp("r2po-gap") / "model", seed=2, std=0.05)
    register_hf_models()
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)


PROMPTS = [[5, 6], [7, 8, 9]]
RESPONSES = [[10, 11, 12], [13]]


def _micro_batch(head, nested: bool = True) -> TensorDict:
    from verl.utils import tensordict_utils as tu

    from recipe_apo.integration.verl_access import HEAD_KEY, RESTART_KEY

    if nested:
        tensors = {"prompts": torch.nested.as_nested_tensor([torch.tensor(p) for p in PROMPTS], layout=torch.jagged),
                   "responses": torch.nested.as_nested_tensor([torch.tensor(r) for r in RESPONSES],
                                                              layout=torch.jagged)}
    else:  # verl's padded layout: prompts left-padded, responses right-padded, the attention mask says which
        tensors = {"prompts": torch.tensor([[0, 5, 6], [7, 8, 9]]), "responses": torch.tensor([[10, 11, 12],
                                                                                              [13, 0, 0]]),
                   "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])}
    non_tensor = {RESTART_KEY: -1} if head is None else {HEAD_KEY: head, RESTART_KEY: -1}
    return tu.get_tensordict(tensor_dict=tensors, non_tensor_dict=non_tensor)


TOKENS = torch.tensor([[5, 6, 10, 11, 12, 0], [7, 8, 9, 13, 0, 0]])  # each sequence a row from its first column


def _forward_step():
    """The wrapper around a stand-in for verl's ``forward_step``: the model's forward on the micro-batch's
    sequences, and verl's metrics of the pass."""
    from recipe_apo.integration.verl_worker_access import with_heads

    def original(engine, micro_batch, loss_function, forward_only):
        logits = engine.module(TOKENS).logits
        return logits.sum(), {"metrics": {"actor/pg_loss": 0.5}}

    return with_heads(original)


def test_an_update_logs_the_head_gap_of_its_response_tokens(model):
    engine = types.SimpleNamespace(module=model, optimizer=torch.optim.AdamW(model.parameters()))
    with model.measuring_head_gap() as gap:  # the measure itself, over the same sequences
        model(TOKENS)
        expected = gap(torch.tensor([2, 3]), torch.tensor([3, 1]))
    assert expected[HEAD_KL] > 0 and expected[HEAD_LOGIT_GAP] > 0
    step = _forward_step()
    for nested in (True, False):
        for head in ("roll", "base"):
            _, output = step(engine, _micro_batch(head, nested), None, False)
            assert set(output["metrics"]) == {"actor/pg_loss", HEAD_KL, HEAD_LOGIT_GAP}
            for key in (HEAD_KL, HEAD_LOGIT_GAP):
                assert output["metrics"][key] == pytest.approx(expected[key], rel=1e-5), (nested, head, key)


def test_forward_only_passes_and_passes_without_a_head_are_not_measured(model):
    engine = types.SimpleNamespace(module=model, optimizer=torch.optim.AdamW(model.parameters()))
    step = _forward_step()
    assert step(engine, _micro_batch("roll"), None, True)[1]["metrics"] == {"actor/pg_loss": 0.5}
    assert step(engine, _micro_batch(None), None, False)[1]["metrics"] == {"actor/pg_loss": 0.5}
    assert model._head_gap is None
