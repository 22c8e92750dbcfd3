"""Every internal of verl that the recipe touches in verl's worker processes, in one module, each named here (the
driver's are ``recipe_apo.integration.verl_access``'s):

- the actor's FSDP engine (``verl.workers.engine.fsdp.transformer_impl.FSDPEngineWithLMHead``): its
  ``forward_step(micro_batch, loss_function, forward_only)``, wrapped (``select_heads_in_forward``), its ``module``
  (FSDP1's ``_fsdp_wrapped_module`` inside) and ``optimizer``; a micro-batch's metadata through
  ``verl.utils.tensordict_utils.get_non_tensor_data``; and the ``metrics`` of a pass's output;
- verl's worker-side loss, ``verl.workers.utils.losses.ppo_loss(config, model_output, data, dp_group)``, which
  ``ColumnLoss`` calls (the driver installs it with the registered worker method ``set_loss_fn``), and the
  micro-batch's TensorDict columns (``keys()``, nested ``values()``);
- the agent loop worker's registry of agent loops, ``verl.experimental.agent_loop.agent_loop._agent_loop_registry``
  (name -> Hydra config of the loop's class; importing its module registers verl's own loops), and how it builds a
  loop (``hydra.utils.instantiate`` with the worker's objects): ``registered_agent_loops``, ``agent_loop``.

A verl release that changes one of these is a change here; nothing else of the recipe reaches into verl's workers
(``tests/test_layers.py`` holds the package to it).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Sequence

import torch

from recipe_apo.methods.errors import BatchInputError
from recipe_apo.methods.loss_inputs import handed_columns

__all__ = ["HEAD_KEY", "RESTART_KEY", "ColumnLoss", "agent_loop", "registered_agent_loops", "select_heads_in_forward",
           "with_heads"]

# The batch metadata that names a pass's logits head, and the step whose update restarts the optimizer (-1: none):
# the recipe's trainer sets them (``verl_access.hand_actor_call``), ``with_heads`` reads them.
HEAD_KEY = "recipe_logits_head"
RESTART_KEY = "recipe_optimizer_restart"


# ---- the actor engine's logits head per pass (``recipe_apo.integration.model_classes``) -----------------------------
def _unwrapped(module):
    return getattr(module, "_fsdp_wrapped_module", module)  # FSDP1 wraps; FSDP2 keeps the model's own object


def _lengths(micro_batch):
    """Each sequence's prompt and response lengths, as verl's ``no_padding_2_padding`` reads them."""
    prompts, responses = micro_batch["prompts"], micro_batch["responses"]
    if prompts.is_nested:
        return prompts.offsets().diff(), responses.offsets().diff()
    mask = micro_batch["attention_mask"]
    return mask[:, : prompts.shape[1]].sum(dim=1), mask[:, prompts.shape[1]:].sum(dim=1)


def select_heads_in_forward() -> None:
    """verl's FSDP engine computes each pass with the logits head its batch names (``with_heads``); idempotent."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    original = FSDPEngineWithLMHead.forward_step
    if getattr(original, "_recipe_apo_heads", False):
        return
    FSDPEngineWithLMHead.forward_step = with_heads(original)


def with_heads(original):
    """``original`` (verl's ``forward_step``) with the head hand-off (``HEAD_KEY`` in the micro-batch's metadata: the
    model's ``select_logits_head``), the optimizer restart (``RESTART_KEY``: once per step that asks) and, in an
    update, the head gap of a model that measures it (``measuring_head_gap``) in the pass's metrics. A pass that
    names no head runs as verl runs it."""
    from verl.utils import tensordict_utils as tu

    @functools.wraps(original)
    def forward_step(self, micro_batch, loss_function, forward_only):
        head = tu.get_non_tensor_data(micro_batch, HEAD_KEY, default=None)
        if head is None:
            return original(self, micro_batch, loss_function, forward_only)
        model = _unwrapped(self.module)
        select = getattr(model, "select_logits_head", None)
        if select is None:
            raise RuntimeError(f"the trainer asks for the logits head {head!r}, but the actor's model "
                               f"({type(model).__name__}) has one head only")
        restart = int(tu.get_non_tensor_data(micro_batch, RESTART_KEY, default=-1))
        if not forward_only and restart >= 0 and getattr(self, "_recipe_apo_restarted", None) != restart:
            self.optimizer.state.clear()  # Adam's moments and step count: as a fresh optimizer
            self._recipe_apo_restarted = restart
        measuring = None if forward_only else getattr(model, "measuring_head_gap", None)
        with select(head), (measuring() if measuring else contextlib.nullcontext()) as gap:
            loss, output = original(self, micro_batch, loss_function, forward_only)
            if gap is not None:
                output["metrics"].update(gap(*_lengths(micro_batch)))
        return loss, output

    forward_step._recipe_apo_heads = True
    return forward_step


# ---- the actor's loss with the methods' loss columns ----------------------------------------------------------------
class ColumnLoss:
    """verl's ``ppo_loss(config, ...)`` with the micro-batch's ``columns`` handed to the policy loss while it runs
    (``recipe_apo.methods.loss_inputs``: verl calls a registered policy loss with its own arguments only), so the
    rest of the loss (KL, entropy, aggregation, metrics) is verl's, unchanged. The trainer writes the columns into the
    batch (``Method.loss_columns``: AGPO (dual)'s clip) and installs this in every actor worker
    (``verl_access.install_column_loss``)."""

    def __init__(self, config: Any, columns: Sequence[str]) -> None:
        self.config, self.columns = config, tuple(columns)

    def __call__(self, model_output: Any, data: Any, dp_group: Any = None):
        from verl.workers.utils.losses import ppo_loss

        handed = {}
        for name in self.columns:
            if name not in data.keys():
                raise BatchInputError(f"the actor's micro-batch has no {name} column: the recipe's trainer writes it "
                                      "before the update")
            value = data[name]
            values = value.values() if getattr(value, "is_nested", False) else torch.as_tensor(value)
            handed[name] = values.reshape(-1)
        with handed_columns(handed):
            return ppo_loss(self.config, model_output, data, dp_group)


# ---- the agent loop worker ------------------------------------------------------------------------------------------
def registered_agent_loops() -> frozenset[str]:
    """The names of the agent loops registered in this process (verl's own and those of the files verl read); the
    launch checks a run's ``default_agent_loop`` against them too (``recipe_apo.integration.validation``)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    return frozenset(_agent_loop_registry)


def agent_loop(name: str, init: dict[str, Any]) -> Any:
    """The registered agent loop ``name`` (one of ``registered_agent_loops``), built as verl's agent loop worker
    builds one, with the worker's objects ``init``."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    return hydra.utils.instantiate(config=_agent_loop_registry[name], **init)
