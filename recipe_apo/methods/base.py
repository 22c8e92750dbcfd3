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
4. ``estimator_inputs(batch)``: what verl does not pass an estimator (data sources, old log-probs), which the adapter
   hands the estimators while verl's ``compute_advantage`` runs;
5. ``after_advantage(step, batch)``, in catalog order (a runtime that rescales the advantages comes last), with what
   the estimators left in ``batch.estimator_results``: metrics, per-row dump columns, per-row loss columns, and
   possibly new advantages;
6. the update (verl's actor, or the testbed's: there, ``loss_denominators`` per mini-batch), then
   ``after_update(step, batch, host)``;

Around steps 3 and 6 the host asks ``actor_call(step, call)`` for each pass of the policy (the old log-probs, the
reference's log-probs, the update): a runtime may pick the model's logits head for it and restart the optimizer
(R2PO's phases).
7. ``end_step(step)``: the step's metrics.

A runtime sees arguments and return values only. What an estimator (a plain function verl calls on the driver)
reads between calls, such as APO's anchors, is the runtime's ``estimator_state()``; the adapters keep it in the
driver process for the estimator, and hand the estimator its inputs and collect its results
(``recipe_apo.methods.handoff``; the process state itself is ``recipe_apo.methods.driver_state``).

Metric names are ``<method>/<quantity>`` wherever they are logged (trainer, testbed, rehearsal, league, audit); a
method's ``metrics`` maps each quantity to what it means, for the reports. Runtime state is a JSON-safe
``state_dict``, written and read by ``recipe_apo.methods.state_codec``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

import numpy as np
import torch

__all__ = ["ActorCall", "EstimatorInputs", "EstimatorResult", "Host", "Launch", "Method", "MethodRuntime", "Probe",
           "Prompts", "StepBatch", "StepOutput", "Trajectories", "load", "setting"]


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
class EstimatorResult:
    """What one estimator call computed beyond its advantages: metrics, and arrays of one value per response
    in the batch's order (``per_response``; with a multi-output agent loop, the final rows')."""

    metrics: dict[str, float] = field(default_factory=dict)
    per_response: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class EstimatorInputs:
    """What a runtime has the adapter hand its estimator for one advantage step, beside verl's arguments (verl
    passes an estimator neither): ``scopes``, each response's data source (APO's ``anchor_scope=data_source``), and
    ``old_log_probs``, the old policy's (rows, length) (CoDaPO's); None hands nothing. Rows are the estimator's (the
    final rows with a multi-output agent loop: ``Trajectories.finals``)."""

    scopes: Optional[np.ndarray] = None
    old_log_probs: Optional[torch.Tensor] = None


@dataclass
class StepBatch:
    """One advantage step's rows, in the host's row order (every output row of a multi-output step).

    ``uids``: each row's prompt group; ``token_level_scores`` (the reward's scores, before any KL penalty) and
    ``response_mask``: (rows, length), padded;
    ``old_log_probs`` and ``entropy``: the old policy's, (rows, length), when a runtime needs them
    (``MethodRuntime.needs``); ``data_sources``: per row, when needed; ``advantages``: verl's, once computed (and as the
    runtimes before this one left them); ``trajectories``: which rows are final outputs;
    ``estimator_results``: what the step's estimator calls left, by estimator name (``EstimatorResult``; set by the
    adapter after verl's advantage step; an estimator that did not run this step has no entry).
    """

    uids: np.ndarray
    token_level_scores: torch.Tensor
    response_mask: torch.Tensor
    trajectories: Trajectories
    old_log_probs: Optional[torch.Tensor] = None
    entropy: Optional[torch.Tensor] = None
    data_sources: Optional[np.ndarray] = None
    advantages: Optional[torch.Tensor] = None
    estimator_results: dict[str, EstimatorResult] = field(default_factory=dict)

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

    def policy_log_probs(self) -> torch.Tensor:
        """The current (just updated) policy's token log-probs of the responses it was just updated on (the rows of
        the ``batch`` that ``after_update`` is handed), (rows, length)."""


@dataclass(frozen=True)
class Launch:
    """What the launch knows beside the resolved config, handed to every method's launch checks by the verl
    integration (which alone knows verl's trainers): ``recipe_trainer``, the run's trainer is the recipe's (the
    runtimes run); ``verl_mode``, verl's V1 mode it runs (``sync``, ``colocate_async``, ``separate_async``, or a
    trainer of the user's own); ``rehearsal``, the CPU rehearsal.

    The CPU testbed runs the same checks on its configs (``recipe_apo.testbed.launch_refusal.check_launch``), as the
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
    Every call is optional; the base does nothing. These are all the adapters call (a test holds them to it)."""

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

    def estimator_state(self) -> Any:
        """The object this method's estimator reads between its calls (APO's anchors, R2PO's phase of the step),
        which the adapters keep in the driver process under ``method.name`` at a run's start, after a restore, after
        ``begin_step`` and at each advantage step; None: nothing (whatever the driver kept under that name is
        dropped)."""
        return None

    def estimator_inputs(self, batch: StepBatch) -> Optional[EstimatorInputs]:
        """What the adapter hands the step's estimator calls while verl computes the advantages (what verl does not
        pass an estimator); None: nothing."""
        return None

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        """The advantages are in ``batch.advantages``, what the estimators left in ``batch.estimator_results``:
        this method's metrics, columns, and new advantages."""
        return StepOutput()

    def loss_denominators(self, rows: torch.Tensor, mask: torch.Tensor) -> Optional[dict[str, Any]]:
        """The CPU testbed's update, which sets each mini-batch's loss denominators itself, asks for the mini-batch
        of ``rows`` (indices into the step's rows; ``mask``: the step's response mask, bool): ``responses`` and
        ``tokens`` replace its denominators, any other key is a note for the update's trace; None: as usual. verl's
        actor fixes its denominators per mini-batch and calls nothing of this."""
        return None

    def actor_call(self, step: int, call: str) -> Optional[ActorCall]:
        """What the policy's pass ``call`` (one of ``ACTOR_CALLS``) of step ``step`` should do (None: as usual)."""
        return None

    def after_update(self, step: int, batch: StepBatch, host: Host) -> None:
        """The policy was updated on ``batch``."""

    def end_step(self, step: int) -> dict[str, float]:
        """The step's updates are done: the step's metrics of this method."""
        return {}


@dataclass(frozen=True)
class Metric:
    """What one of a method's metrics means (``words``), and the tables beyond every metric's (the testbed's report,
    which shows each one's mean over the rounds) that show it: ``headline``, the CPU rehearsal's table of the last
    step's values, and the testbed's plot of the methods' series; ``trust``, the league's table of the generation
    and the trust region; ``league``, the league's table of the method's own workings in each scenario; ``final``, a
    value the method carries from step to step (KL_bar): the league's tables show its last round's, not its mean;
    ``peak``, a value whose worst case matters (a largest deviation): the league's tables show its largest over every
    round of every seed."""

    words: str
    headline: bool = False
    trust: bool = False
    league: bool = False
    final: bool = False
    peak: bool = False


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator a method registers with verl (``Method.estimator``): ``function``, with verl's
    signature; ``needs``, what it reads beyond a batch's rewards, mask and uids (the recipe's trainer hands it over;
    the demo and the audit's replay, which have a batch only, cannot run it); ``reads_std_norm``, it divides by the
    group's std as ``algorithm.norm_adv_by_std_in_grpo`` says, as verl's ``grpo`` does."""

    function: Callable
    needs: Optional[str] = None
    reads_std_norm: bool = False


@dataclass(frozen=True)
class PolicyLoss:
    """A policy loss a method registers with verl (``Method.loss``): ``function``, with verl's signature; ``columns``,
    the per-row inputs it reads (its runtime's ``StepOutput.loss_columns``, handed micro-batch by micro-batch);
    ``metrics``, what it logs beside verl's own (``actor/<method>_<quantity>`` -> ``Metric``)."""

    function: Callable
    columns: tuple[str, ...] = ()
    metrics: Mapping[str, Metric] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelParts:
    """What a method adds to the model (R2PO's rollout head), for the places that build one:

    - ``hf``: functions registering its model classes with transformers, run in every process where verl builds a
      model (``actor_rollout_ref.model.external_lib``, which its preset names);
    - ``vllm``: architecture -> ``module:Class`` of its vLLM model classes (the recipe's vLLM plugin registers them
      lazily, as vLLM's registry takes them, so that its processes import none until a checkpoint asks);
    - ``prepare``: ``prepare(source, folder)``, the model a run trains from the run's model ``source`` (R2PO's: a
      copy with a rollout head, made once in ``folder``), called by the launch before Ray starts;
    - ``policy_head``: ``policy_head(hidden_size, vocab_size, generator)``, the residual logits head the testbed's
      policy gains (its logits ``BASE_HEAD`` or ``ROLLOUT_HEAD``).
    """

    hf: tuple[Callable[[], None], ...] = ()
    vllm: Mapping[str, str] = field(default_factory=dict)
    prepare: Optional[Callable[[str, Any], Any]] = None
    policy_head: Optional[Callable[..., Any]] = None


class Parts:
    """What a method's modules declare of themselves where they define it (``Method``'s decorators), by kind."""

    def __init__(self) -> None:
        self.estimators: dict[str, Estimator] = {}
        self.losses: dict[str, PolicyLoss] = {}
        self.runtime: Optional[type] = None
        self.checks: list[Callable[[Launch], None]] = []
        self.warnings: list[Callable[[Launch], Optional[str]]] = []


def _same(a: Any, b: Any) -> bool:
    """Whether two definitions are one (the same module and name: a module imported again defines it anew)."""
    return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None), getattr(b, "__qualname__", None))


def _add(found: list, item: Any) -> None:
    """``item`` into ``found``, in place of a former definition of it, else last (definition order)."""
    for index, known in enumerate(found):
        if _same(known, item):
            found[index] = item
            return
    found.append(item)


@dataclass(frozen=True)
class Method:
    """A method's declaration: everything the adapters, the plugin, the launch and the reports know of it.

    The package's ``__init__`` declares it (``METHOD = Method(...)``) and then imports its modules, whose parts
    declare themselves where they are defined, with its decorators::

        @METHOD.estimator("apo")              an advantage estimator verl calls by that name (``Estimator``)
        @METHOD.loss("apo")                   a policy loss verl calls by that name (``PolicyLoss``)
        @METHOD.runtime                       its ``MethodRuntime`` (none: no step logic)
        @METHOD.launch_check                  a function of a ``Launch`` run before Ray starts: raises
                                              ``MethodConfigError``
        @METHOD.launch_warning                the same, returning a line to print, or None

    The fields:

    - ``name``: the package's name, the prefix of its metrics (``apo/anchor``), its settings node
      (``algorithm.<name>``: ``settings_key``) and its state file (``<name>_state.json``: ``state_file``);
    - ``title``: how reports name it (and its presets, unless their header says otherwise); ``presets``: its files
      in ``conf/method/``;
    - ``active``: the one predicate "does a run of this config use the method";
    - ``settings``: its settings dataclass (None: none);
    - ``prompt_columns``: per-prompt sampling settings its runtime sets (``temperature``);
    - ``plain_verl``: its estimator and loss run in plain verl's trainer too, where the recipe's checkpoint callback
      keeps its runtime's state (APO's anchor);
    - ``old_state_files``: the names its state file had before, read on resume where a folder has no
      ``state_file`` (a checkpoint written before the rename still resumes);
    - ``models``: what it adds to the model (``ModelParts``);
    - ``metrics``: quantity -> what it means (the metric is ``<name>/<quantity>``), as words or a ``Metric``;
    - ``order``, ``rescales_advantages``: its place at every hand-off (the runtimes, the launch checks, the reports;
      ``catalog.methods``): a method that rescales the advantages every other method has seen comes last; the
      others by ``order``, then those without one by name.
    - ``featured``: a method the recipe is about (APO): the testbed report's verdict sentences set each run of it
      against every other method of the run.
    """

    name: str
    title: str
    active: Callable[[Any], bool]
    presets: tuple[str, ...] = ()
    settings: Optional[type] = None
    prompt_columns: tuple[str, ...] = ()
    plain_verl: bool = False
    old_state_files: tuple[str, ...] = ()
    models: ModelParts = field(default_factory=ModelParts)
    metrics: Mapping[str, Metric] = field(default_factory=dict)
    order: Optional[float] = None
    rescales_advantages: bool = False
    featured: bool = False
    parts: Parts = field(default_factory=Parts, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Words alone are a metric with no table of its own.
        metrics = {q: m if isinstance(m, Metric) else Metric(m) for q, m in self.metrics.items()}
        object.__setattr__(self, "metrics", metrics)

    # ---- the parts' decorators ----------------------------------------------------------------------------------
    def estimator(self, name: str, needs: Optional[str] = None, reads_std_norm: bool = False) -> Callable:
        """Registers the decorated function as the advantage estimator ``name`` (``Estimator``)."""
        return self._registering(self.parts.estimators, name, "estimator",
                                 lambda f: Estimator(f, needs, reads_std_norm))

    def loss(self, name: str, columns: Sequence[str] = (), metrics: Optional[Mapping[str, Any]] = None) -> Callable:
        """Registers the decorated function as the policy loss ``name`` (``PolicyLoss``); ``metrics``: name -> words
        or ``Metric``."""
        logged = {k: m if isinstance(m, Metric) else Metric(m) for k, m in (metrics or {}).items()}
        return self._registering(self.parts.losses, name, "policy loss",
                                 lambda f: PolicyLoss(f, tuple(columns), logged))

    def _registering(self, table: dict, name: str, kind: str, part: Callable[[Callable], Any]) -> Callable:
        def register(function: Callable) -> Callable:
            known = table.get(name)
            if known is not None and not _same(known.function, function):
                raise ValueError(f"{self.name} declares two {kind}s named {name!r}: "
                                 f"{known.function.__qualname__} and {function.__qualname__}")
            table[name] = part(function)
            return function

        return register

    def runtime(self, cls: type) -> type:
        """Declares the decorated ``MethodRuntime`` subclass as the method's runtime."""
        if self.parts.runtime is not None and not _same(self.parts.runtime, cls):
            raise ValueError(f"{self.name} declares two runtimes: {self.parts.runtime.__qualname__} and "
                             f"{cls.__qualname__}")
        cls.method = self
        self.parts.runtime = cls
        return cls

    def launch_check(self, function: Callable[[Launch], None]) -> Callable[[Launch], None]:
        """Declares the decorated function a launch check (run in definition order)."""
        _add(self.parts.checks, function)
        return function

    def launch_warning(self, function: Callable[[Launch], Optional[str]]) -> Callable[[Launch], Optional[str]]:
        """Declares the decorated function a launch warning (run in definition order)."""
        _add(self.parts.warnings, function)
        return function

    # ---- what the declaration says ------------------------------------------------------------------------------
    @property
    def estimators(self) -> dict[str, Callable]:
        """What it registers with verl as advantage estimators: name -> function."""
        return {name: e.function for name, e in self.parts.estimators.items()}

    @property
    def losses(self) -> dict[str, Callable]:
        """What it registers with verl as policy losses: name -> function."""
        return {name: loss.function for name, loss in self.parts.losses.items()}

    def estimator_needs(self, estimator: str) -> Optional[str]:
        """What its estimator ``estimator`` reads beyond a batch's rewards, mask and uids (None: nothing)."""
        found = self.parts.estimators.get(estimator)
        return None if found is None else found.needs

    @property
    def loss_columns(self) -> tuple[str, ...]:
        """The per-row inputs its losses read (handed micro-batch by micro-batch)."""
        return tuple(dict.fromkeys(c for loss in self.parts.losses.values() for c in loss.columns))

    @property
    def loss_metrics(self) -> dict[str, Metric]:
        """What its losses log beside verl's own: ``actor/<method>_<quantity>`` -> ``Metric``."""
        return {name: m for loss in self.parts.losses.values() for name, m in loss.metrics.items()}

    @property
    def settings_key(self) -> Optional[str]:
        """Its settings' node under ``algorithm`` (None: no settings)."""
        return None if self.settings is None else self.name

    @property
    def state_file(self) -> str:
        """Its runtime's file in a checkpoint folder (written when the runtime has a state to save)."""
        return f"{self.name}_state.json"

    @property
    def changes_advantages(self) -> bool:
        """Its estimator or its runtime gives advantages other than verl's estimator of its preset's settings would
        (the demo and the audit show a column only for a preset whose advantages differ)."""
        return bool(self.parts.estimators) or self.rescales_advantages

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
        if self.parts.runtime is None:
            return None
        return self.parts.runtime(config)

    def checks(self) -> Sequence[Callable[[Launch], None]]:
        return list(self.parts.checks)

    def warnings(self) -> Sequence[Callable[[Launch], Optional[str]]]:
        return list(self.parts.warnings)


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


def load(spec: Any) -> Any:
    """The object ``module:attribute`` names (a setting's, such as a user's ``vote_key``); anything but such a string
    is that object itself (a declaration's part)."""
    import importlib

    if not isinstance(spec, str):
        return spec

    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)
