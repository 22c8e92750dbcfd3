"""What a method of the recipe is, and what its runtime gets and gives, on plain arrays.

A method is one package under ``recipe_apo.methods`` holding its maths, its loss, its settings (declared once), its
launch checks and one **runtime**: the step-level logic that verl's trainer and the CPU testbed both drive
(``recipe_apo.integration.trainer`` and ``recipe_apo.testbed.train``, the two adapters). The package declares itself
with one ``Method`` (its names, its parts, what its runtime reads and writes); ``recipe_apo.methods.catalog`` lists
the packages. Nothing outside a method's package names the method: the adapters, the plugin, the launch and the
reports read these declarations.

A step, as both adapters run it (verl's V1 trainer step; a testbed round):

1. ``begin_step(step)``;
2. ``replace_prompts(step, count)``: the first runtime that returns prompt columns replaces the dataloader's draw
   (CoDaPO's second step of a pair); otherwise the host draws and every runtime sees ``drew_prompts`` (CoDaPO's
   first step keeps the table; AGPO probes it through ``host.probe`` and returns each prompt's temperature);
3. the rollout, the old log-probs (and their token entropies when a runtime needs them);
4. ``estimator_inputs(batch)``: contexts held while verl's ``compute_advantage`` runs (what verl does not pass an
   estimator: data sources, old log-probs);
5. ``after_advantage(step, batch)``, in catalog order (a runtime that rescales the advantages comes last): metrics,
   per-row dump columns, per-row loss columns, and possibly new advantages;
6. the update (verl's actor, or the testbed's), then ``after_update(step, batch, host)``;

Around steps 3 and 6 the host asks ``actor_call(step, call)`` for each pass of the policy (the old log-probs, the
reference's log-probs, the update): a runtime may pick the model's logits head for it and restart the optimizer
(R2PO's phases).
7. ``end_step(step)``: the step's metrics.

Metric names are ``<method>/<quantity>`` wherever they are logged (trainer, testbed, rehearsal, league, audit); a
method's ``metrics`` maps each quantity to what it means, for the reports. Runtime state is a JSON-safe
``state_dict``, written and read by ``recipe_apo.methods.state_codec``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping, Optional, Protocol, Sequence

import numpy as np
import torch

__all__ = ["ActorCall", "Host", "Launch", "Method", "MethodRuntime", "Probe", "Prompts", "StepBatch", "StepOutput",
           "Trajectories", "load", "setting"]


@dataclass(frozen=True)
class Trajectories:
    """The trajectories of a step's rows: with a multi-output agent loop a trajectory is several rows, its last
    (final) output holding the outcome that verl scores and that a group estimator sees.

    ``final_rows[s]``: the row of trajectory s's final output; ``row_trajectory[i]``: the trajectory of row i.
    """

    final_rows: np.ndarray
    row_trajectory: np.ndarray

    @classmethod
    def single(cls, rows: int) -> "Trajectories":
        """One output per trajectory (every row its own final output)."""
        index = np.arange(rows, dtype=np.int64)
        return cls(index, index)

    @property
    def rows(self) -> int:
        return len(self.row_trajectory)

    @property
    def count(self) -> int:
        return len(self.final_rows)

    @property
    def single_output(self) -> bool:
        return self.count == self.rows

    @property
    def is_final(self) -> np.ndarray:
        final = np.zeros(self.rows, dtype=bool)
        final[self.final_rows] = True
        return final

    def finals(self, per_row: Any) -> Any:
        """The final rows of a per-row array or tensor (the rows an estimator sees); itself when single-output."""
        if self.single_output or per_row is None:
            return per_row
        if isinstance(per_row, torch.Tensor):
            return per_row[torch.from_numpy(self.final_rows).to(per_row.device)]
        return np.asarray(per_row)[self.final_rows]

    def broadcast(self, per_trajectory: Any) -> np.ndarray:
        """Each row's value of a per-trajectory array (one value per final row, in ``final_rows`` order)."""
        values = np.asarray(per_trajectory)
        if values.shape[:1] != (self.count,):
            from recipe_apo.methods.errors import BatchInputError

            raise BatchInputError(f"multi-output: {values.shape[0] if values.ndim else 0} per-trajectory values for "
                                  f"{self.count} trajectories of {self.rows} rows")
        return values if self.single_output else values[self.row_trajectory]


@dataclass
class StepBatch:
    """One advantage step's rows, in the host's row order (every output row of a multi-output step).

    ``uids``: each row's prompt group; ``token_level_scores`` (the reward's scores, before any KL penalty) and
    ``response_mask``: (rows, length), padded;
    ``old_log_probs`` and ``entropy``: the old policy's, (rows, length), when a runtime needs them
    (``MethodRuntime.needs``); ``data_sources``: per row, when needed; ``advantages``: verl's, once computed (and as the
    runtimes before this one left them); ``trajectories``: which rows are final outputs.
    """

    uids: np.ndarray
    token_level_scores: torch.Tensor
    response_mask: torch.Tensor
    trajectories: Trajectories
    old_log_probs: Optional[torch.Tensor] = None
    entropy: Optional[torch.Tensor] = None
    data_sources: Optional[np.ndarray] = None
    advantages: Optional[torch.Tensor] = None

    @property
    def rows(self) -> int:
        return int(self.response_mask.shape[0])


@dataclass
class StepOutput:
    """What ``after_advantage`` gives back: new ``advantages`` (None: unchanged), ``metrics`` (``<method>/...``),
    ``dump`` columns (one value per row, for verl's rollout dump) and ``loss_columns`` (one value per row, handed
    to the policy loss micro-batch by micro-batch; ``Method.loss_columns`` names them)."""

    advantages: Optional[torch.Tensor] = None
    metrics: dict[str, float] = field(default_factory=dict)
    dump: dict[str, np.ndarray] = field(default_factory=dict)
    loss_columns: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Prompts:
    """A step's drawn prompts: one uid per prompt, and the prompt table (column name -> one value per prompt: a
    tensor whose first dimension is the prompt, or a list), which a runtime may keep (CoDaPO) and the host
    rebuilds a batch from; ``source`` is the host's own batch of them (a runtime hands it back in ``host.probe``)."""

    uids: np.ndarray
    columns: dict[str, Any]
    source: Any = None

    def __len__(self) -> int:
        return len(self.uids)


@dataclass
class Probe:
    """``host.probe``'s answer: ``rewards`` (prompts, samples), each response's answer key (prompts lists of
    samples strings) and the responses' token count."""

    rewards: np.ndarray
    keys: list[list[str]]
    tokens: int


class Host(Protocol):
    """What a runtime asks of the adapter that drives it: what only a trainer or a testbed can do."""

    def probe(self, prompts: Prompts, samples: int, temperature: float, answer_key: Callable[[str], str]) -> Probe:
        """``samples`` responses to each of ``prompts`` at ``temperature``, scored and dropped afterwards; each
        response's answer key is ``answer_key`` of its text. A host whose task has answers of its own (the
        testbed) uses those, and refuses a run whose runtime has a ``custom_answer_key``."""

    def policy_log_probs(self, batch: StepBatch) -> torch.Tensor:
        """The current (just updated) policy's token log-probs of ``batch``'s responses, (rows, length)."""


@dataclass(frozen=True)
class Launch:
    """What the launch knows beside the resolved config, handed to every method's launch checks by the verl
    integration (which alone knows verl's trainers): ``recipe_trainer``, the run's trainer is the recipe's (the
    runtimes run); ``verl_mode``, verl's V1 mode it runs (``sync``, ``colocate_async``, ``separate_async``, or a
    trainer of the user's own); ``rehearsal``, the CPU rehearsal.

    The CPU testbed runs the same checks on its configs (``recipe_apo.testbed.setting_check.check_launch``), as the
    recipe's sync trainer, with ``testbed`` true (its policy is its own: no model folder to check) and ``staleness``
    its lag (rounds by which its sampling policy trails the trained one: what it has of an asynchronous mode); a
    check skips, where ``testbed`` is true, only what the testbed runs otherwise on purpose."""

    config: Any
    recipe_trainer: bool
    verl_mode: str
    rehearsal: bool = False
    testbed: bool = False
    staleness: int = 0

    @property
    def asynchronous(self) -> bool:
        return self.verl_mode in ("colocate_async", "separate_async")


# The logits heads of a model with a residual head (R2PO's): ``base`` its own logits z, ``roll`` z + delta.
BASE_HEAD, ROLLOUT_HEAD = "base", "roll"

# The policy's passes a runtime may set (``MethodRuntime.actor_call``): the old log-probs, the reference's, the update.
ACTOR_CALLS = ("old_log_probs", "ref_log_probs", "update")


@dataclass(frozen=True)
class ActorCall:
    """What a runtime asks of one pass of the policy: ``logits_head``, which logits the model's forward returns
    (a model with several, such as R2PO's ``roll`` and ``base``; None: the model's own default); and, for an
    update, ``restart_optimizer``: the optimizer's state (Adam's moments and step count) starts afresh before it."""

    logits_head: Optional[str] = None
    restart_optimizer: bool = False

    @classmethod
    def of(cls, calls: Sequence[Optional["ActorCall"]]) -> Optional["ActorCall"]:
        """The runtimes' calls for one pass as one (None: none asked anything): the last head named, and a restart
        if any asks for one."""
        asked = [c for c in calls if c is not None]
        if not asked:
            return None
        head = next((c.logits_head for c in reversed(asked) if c.logits_head is not None), None)
        return cls(head, any(c.restart_optimizer for c in asked))


class MethodRuntime:
    """One run of a method: its state and the step-level logic both adapters drive (the module's docstring).
    Every call is optional; the base does nothing."""

    # The method's declaration; set by ``Method.build_runtime``.
    method: "Method"
    # The batch fields it reads beyond uids, scores and the mask: ``old_log_probs``, ``entropy``, ``data_sources``.
    needs: frozenset = frozenset()
    # A rule from a response's text to its answer that the user set (the setting, ``key=value``; None: the method's
    # default): a host whose task has answers of its own (the testbed) refuses the run.
    custom_answer_key: Optional[str] = None
    # The largest state file a resume reads for it, in bytes (None: ``state_codec.MAX_STATE_BYTES``): a runtime that
    # writes little names a bound near what it writes.
    state_max_bytes: Optional[int] = None

    def __init__(self, config: Any) -> None:
        self.config = config

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self, step: int) -> Optional[dict]:
        """The runtime's state after step ``step``, for its checkpoint (``state_codec``: JSON values, tensors and
        arrays); None: nothing to save."""
        return None

    def load_state_dict(self, state: dict, step: int) -> None:
        """Restore ``state_dict``'s output saved at ``step``; anything else raises ``MethodStateError``."""

    def state_needed(self, step: int) -> bool:
        """Whether resuming from the checkpoint of ``step`` reads the runtime's state file."""
        return False

    def state_unreadable(self, path: str, reason: str, step: int) -> None:
        """A resume at ``step`` found ``path`` missing or unreadable (``reason``): raise, or start fresh."""
        from recipe_apo.methods.errors import MethodStateError

        raise MethodStateError(f"cannot resume {self.method.title}'s state from {path}: {reason}")

    # ---- the step -------------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """A training step (a testbed round) starts; ``step`` counts from 1, as verl's ``global_steps``."""

    def replace_prompts(self, step: int, count: int) -> Optional[dict[str, Any]]:
        """``count`` prompts (a prompt table) to train on instead of the dataloader's, or None."""
        return None

    def drew_prompts(self, step: int, prompts: Prompts, host: Host) -> dict[str, np.ndarray]:
        """The host drew ``prompts`` (before their rollout); per-prompt sampling settings (``Method.prompt_columns``:
        name -> one value per prompt) for their rollout."""
        return {}

    def estimator_inputs(self, batch: StepBatch) -> ContextManager:
        """A context held while verl computes the step's advantages (what verl does not pass an estimator)."""
        return contextlib.nullcontext()

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        """The advantages are in ``batch.advantages``: this method's metrics, columns, and new advantages."""
        return StepOutput()

    def actor_call(self, step: int, call: str) -> Optional[ActorCall]:
        """What the policy's pass ``call`` (one of ``ACTOR_CALLS``) of step ``step`` should do (None: as usual)."""
        return None

    def after_update(self, step: int, batch: StepBatch, host: Host) -> None:
        """The policy was updated on ``batch``."""

    def end_step(self, step: int) -> dict[str, float]:
        """The step's updates are done: the step's metrics of this method."""
        return {}


@dataclass(frozen=True)
class Method:
    """A method's declaration: everything the adapters, the plugin and the reports need to know of it.

    - ``name``: the package's name and the prefix of its metrics (``apo/anchor``);
    - ``title``: how reports name it; ``presets``: its files in ``conf/method/``;
    - ``estimators`` and ``losses``: what it registers with verl, name -> ``module:function`` (imported when the
      plugin registers, so a declaration is light);
    - ``settings``: its settings dataclass, read from ``algorithm.<settings_key>`` (None: none);
    - ``active``: the one predicate "does a run of this config use the method";
    - ``runtime``: ``module:Class`` of its ``MethodRuntime`` (None: the method has no step logic);
    - ``launch_checks``, ``launch_warnings``: functions of a ``Launch`` (``module:function`` each), run before Ray
      starts; a check raises ``MethodConfigError``, a warning returns a line or None;
    - ``loss_columns``: per-row inputs its loss reads (handed micro-batch by micro-batch);
    - ``prompt_columns``: per-prompt sampling settings its runtime sets (``temperature``);
    - ``changes_advantages``: its runtime or estimator gives advantages other than verl's estimator of its preset's
      settings would (the demo and the audit show a column only for a preset whose advantages differ);
    - ``estimator_needs``: what its estimator reads beyond a batch's rewards, mask and uids (the recipe's trainer
      hands it over; the demo and the audit's replay, which have a batch only, cannot run it);
    - ``state_file``: its runtime's file in a checkpoint folder;
    - ``plain_verl``: its estimator and loss run in plain verl's trainer too, where the recipe's checkpoint callback
      keeps its runtime's state (APO's anchor);
    - ``hf_models``: functions (``module:function``) that register its model classes with transformers, run in
      every process where verl builds a model (``actor_rollout_ref.model.external_lib``, which its preset names);
    - ``vllm_models``: architecture -> ``module:Class`` of its vLLM model classes (the recipe's vLLM plugin);
    - ``model_preparer``: ``module:function(source, folder)`` giving the model a run of the method trains from the
      run's model (R2PO's: a copy with a rollout head, made once in ``folder``), called by the launch before Ray
      starts;
    - ``policy_head``: ``module:function(hidden_size, vocab_size, generator)`` making the residual logits head the
      testbed's policy gains (its logits ``BASE_HEAD`` or ``ROLLOUT_HEAD``);
    - ``metrics``: quantity -> what it means (the metric is ``<name>/<quantity>``).
    """

    name: str
    title: str
    active: Callable[[Any], bool]
    presets: tuple[str, ...] = ()
    estimators: Mapping[str, str] = field(default_factory=dict)
    losses: Mapping[str, str] = field(default_factory=dict)
    settings: Optional[type] = None
    settings_key: Optional[str] = None
    runtime: Optional[str] = None
    launch_checks: tuple[str, ...] = ()
    launch_warnings: tuple[str, ...] = ()
    loss_columns: tuple[str, ...] = ()
    prompt_columns: tuple[str, ...] = ()
    changes_advantages: bool = True
    estimator_needs: Optional[str] = None
    state_file: Optional[str] = None
    plain_verl: bool = False
    hf_models: tuple[str, ...] = ()
    vllm_models: Mapping[str, str] = field(default_factory=dict)
    model_preparer: Optional[str] = None
    policy_head: Optional[str] = None
    metrics: Mapping[str, str] = field(default_factory=dict)

    def metric(self, quantity: str) -> str:
        """The one name of a quantity of this method, everywhere: ``<method>/<quantity>``."""
        return f"{self.name}/{quantity}"

    def read_settings(self, algorithm_config: Any) -> Any:
        """This method's settings from verl's ``algorithm`` node (its defaults where the node has none)."""
        if self.settings is None:
            return None
        return self.settings.from_algorithm_config(algorithm_config)

    def build_runtime(self, config: Any) -> Optional[MethodRuntime]:
        """A fresh runtime for a run of ``config`` (None when the method has no step logic)."""
        if self.runtime is None:
            return None
        runtime_class = load(self.runtime)
        runtime_class.method = self
        runtime = runtime_class(config)
        return runtime

    def checks(self) -> Sequence[Callable[[Launch], None]]:
        return [load(spec) for spec in self.launch_checks]

    def warnings(self) -> Sequence[Callable[[Launch], Optional[str]]]:
        return [load(spec) for spec in self.launch_warnings]


def setting(config: Any, dotted: str, default: Any = None) -> Any:
    """``config.<dotted>`` of a config node or mapping, or ``default`` where a level is missing (a predicate reads
    configs of every shape: the trainer's, the testbed's, a test's few keys)."""
    node = config
    for part in dotted.split("."):
        getter = getattr(node, "get", None)
        if not callable(getter):
            return default
        node = getter(part, None)
        if node is None:
            return default
    return node


def load(spec: str) -> Any:
    """The object ``module:attribute`` names."""
    import importlib

    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)
