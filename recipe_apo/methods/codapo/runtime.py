"""CoDaPO over a run: the old policy's log-probs handed to its estimator, and its prompt resampling in pairs of steps.

verl passes an estimator no log-probs: ``estimator_inputs`` has the adapter hand them over (the final rows' with a
multi-output agent loop: c_g averages each trajectory's final output, the output the reward scored). ``codapo/*``
metrics and each row's weight w_g in the rollout dump (``codapo_weight``) come from the estimator's result
(``StepBatch.estimator_results``).

**Resampling** (``algorithm.codapo.resample=true``): steps pair by number. An odd step (verl counts from 1) draws
its prompts from the dataloader and keeps them (``drew_prompts``); its advantage steps record each response's w_g;
at its end the prompts whose w_g reaches the ``percentile`` are selected (``StepPairing.select``). The even step
after it trains on them instead of the dataloader's (``replace_prompts``): each kept prompt ``repeat_count`` times
in place, each copy a fresh group. verl's batch size and step count stay as they are, so a run of N steps reads
N/2 loader batches (CoDaPO's own trainer doubles the steps of an epoch instead). Pairing by step number, not by a
counter, is what lets a resume land in the middle of a pair: an odd step's checkpoint holds the kept prompts
(``codapo_state.json``), and the resumed run trains the even step on them. Files of the old pickle format
(``codapo_state.pt``) are refused: reading them back could run any code the file holds.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.methods.base import EstimatorInputs, Host, MethodRuntime, Prompts, StepBatch, StepOutput
from recipe_apo.methods.codapo import METHOD
from recipe_apo.methods.codapo.estimator import resample_order, select_prompts
from recipe_apo.methods.codapo.settings import CodapoSettings
from recipe_apo.methods.errors import MethodStateError
from recipe_apo.methods.state_codec import is_count, shown, unknown_keys

NOTHING_KEPT = ("codapo resampling: no weighted step to resample from (the odd step computed no codapo advantages); "
                "set algorithm.codapo.resample=false or algorithm.adv_estimator=codapo")
OLD_STATE_FILE = "codapo_state.pt"


class ResamplingStateError(MethodStateError):
    """The kept prompts a resumed step needs cannot be had; the message names the file and the way out."""


def first_of_pair(step: int) -> bool:
    """Odd steps (verl counts from 1) read the dataloader; even steps train on the previous step's kept prompts."""
    return step % 2 == 1


def take(columns: dict[str, Any], positions: np.ndarray) -> dict[str, Any]:
    """The rows ``positions`` of a prompt table (tensors, numpy arrays or lists, one value per prompt)."""
    out = {}
    for name, values in columns.items():
        if isinstance(values, torch.Tensor):
            out[name] = values[torch.as_tensor(positions, dtype=torch.long)]
        elif isinstance(values, np.ndarray):
            out[name] = values[positions]
        else:
            out[name] = [values[int(i)] for i in positions]
    return out


class StepPairing:
    """The pairing of CoDaPO's steps on prompt positions, with no batch type.

    A first step (``first_of_pair``) ``start``s a pair and records the per-response weights of its advantage
    computations (``add_weights``); ``select`` keeps the positions of its prompts whose w_g reaches the
    percentile (``estimator.select_prompts``), once; the step after it trains on ``second_order``: positions
    among the kept prompts, each ``repeat_count`` times in place."""

    def __init__(self, settings: CodapoSettings) -> None:
        self.settings = settings
        self.kept_step: Optional[int] = None  # the first step of the pair under way
        self.kept: Optional[np.ndarray] = None  # positions of its kept prompts among its prompts, once selected
        self.response_uids: list[np.ndarray] = []
        self.response_weights: list[np.ndarray] = []
        self._collecting = False  # from ``start`` to the selection: the weights the selection reads

    def start(self, step: int) -> None:
        """First step ``step`` begins: the previous pair's prompts and weights are dropped."""
        self.kept_step, self.kept, self._collecting = step, None, True
        self.response_uids, self.response_weights = [], []

    def add_weights(self, uids: np.ndarray, weights: np.ndarray) -> None:
        """One advantage computation's per-response uids and w_g (verl may split a step into several); ignored
        outside a first step's selection."""
        if self._collecting:
            self.response_uids.append(np.asarray(uids, dtype=object))
            self.response_weights.append(np.asarray(weights, dtype=np.float64))

    def select(self, prompt_uids: Optional[Any]) -> np.ndarray:
        """Positions, in ``prompt_uids`` order (the first step's prompts), of the kept prompts; selected once,
        from every weight the first step recorded. ``prompt_uids`` is read only while nothing is selected."""
        if self.kept is None:
            if prompt_uids is None or not self._collecting or not self.response_uids:
                raise ResamplingStateError(NOTHING_KEPT)
            self.kept = select_prompts(
                list(prompt_uids),
                np.concatenate(self.response_uids),
                np.concatenate(self.response_weights),
                self.settings.percentile,
            )
            self._collecting = False
        return self.kept

    def restore(self, kept_count: int, step: int) -> None:
        """The pair of first step ``step`` whose ``kept_count`` kept prompts a checkpoint holds, in order."""
        self.kept_step, self.kept, self._collecting = step, np.arange(kept_count), False
        self.response_uids, self.response_weights = [], []

    def second_order(self, batch_size: int, step: int) -> np.ndarray:
        """Second step ``step``'s prompts as positions among the kept prompts (``resample_order``): each
        ``repeat_count`` times in place, from the first again until ``batch_size`` are filled."""
        if self.kept is None:
            raise ResamplingStateError(NOTHING_KEPT)
        if self.kept_step != step - 1:
            raise ResamplingStateError(
                f"codapo resampling: step {step} needs the prompts kept at step {step - 1}, "
                f"but the kept prompts are from step {self.kept_step}"
            )
        return resample_order(np.arange(len(self.kept)), batch_size, self.settings.repeat_count)


def _batch_size(config: Any) -> Optional[int]:
    """The run's ``data.train_batch_size`` when its config has a whole number there (a test's few keys may not)."""
    data = config.get("data", None) if hasattr(config, "get") else None
    size = data.get("train_batch_size", None) if hasattr(data, "get") else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


@METHOD.runtime
class CodapoRuntime(MethodRuntime):
    needs = frozenset({"old_log_probs"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.settings = CodapoSettings.from_algorithm_config(config.algorithm)
        self.pairing = StepPairing(self.settings) if self.settings.resample else None
        self.prompts: Optional[Prompts] = None  # an odd step's drawn prompts, until their selection
        self.kept: Optional[dict[str, Any]] = None  # the table of the pair's kept prompts, once selected

    # ---- state: an odd step's kept prompts ------------------------------------------------------------------
    def state_dict(self, step: int) -> Optional[dict]:
        if self.pairing is None or not first_of_pair(step):
            return None  # nothing to keep after an even step
        return {"step": int(step), "kept": self._select()}

    def state_needed(self, step: int) -> bool:
        return self.pairing is not None and first_of_pair(step)

    def load_state_dict(self, state: dict, step: int) -> None:
        """The kept prompts of first step ``step``, as ``state_dict`` writes them: ``step`` (that step, a whole
        number) and ``kept``, a table of columns (lists or arrays, one value per kept prompt, at least one), and no
        other key."""
        if not isinstance(state, dict):
            raise MethodStateError(f"it is not the kept prompts of step {step} (a {type(state).__name__})")
        unknown = unknown_keys(state, ("step", "kept"))
        if unknown:
            raise MethodStateError(f"it holds keys the recipe does not write: {unknown}")
        saved, kept = state.get("step"), state.get("kept")
        if not is_count(saved) or saved != step:  # true == 1 and 1.0 == 1 in Python: the type is checked first
            raise MethodStateError(f"it is not the kept prompts of step {step} (step {shown(saved)})")
        if not isinstance(kept, dict) or not kept:
            raise MethodStateError("it holds no table of kept prompts")
        columns = [name for name, values in kept.items() if not isinstance(values, (list, torch.Tensor))
                   or (isinstance(values, torch.Tensor) and values.dim() == 0)]
        if columns:
            raise MethodStateError(f"its kept prompts' column {shown(columns[0])} is not a list of rows")
        sizes = {len(values) for values in kept.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise MethodStateError(f"its kept prompts' columns differ in length or are empty ({sorted(sizes)[:5]})")
        drawn = _batch_size(self.config)
        if drawn is not None and next(iter(sizes)) > drawn:  # kept from one draw of the loader's batch
            raise MethodStateError(f"it keeps {next(iter(sizes))} prompts, more than a step draws "
                                   f"(data.train_batch_size={drawn})")
        self.prompts, self.kept = None, kept
        self.pairing.restore(sizes.pop(), step)

    def state_unreadable(self, path: str, reason: str, step: int) -> None:
        way_out = (f"step {step} is the first of a CoDaPO pair and step {step + 1} trains on its kept prompts; "
                   "resume from an even step's checkpoint (trainer.resume_mode=resume_path), or set "
                   "algorithm.codapo.resample=false")
        old = os.path.join(os.path.dirname(path), OLD_STATE_FILE)
        if reason == "it is missing" and os.path.exists(old):
            raise ResamplingStateError(
                f"{old} holds the kept prompts in the old pickle format, which this version does not read (unpickling "
                f"a file can run code): {way_out}")
        raise ResamplingStateError(f"cannot resume CoDaPO's kept prompts from {path}: {reason}: {way_out}")

    # ---- the step -------------------------------------------------------------------------------------------
    def replace_prompts(self, step: int, count: int) -> Optional[dict[str, Any]]:
        if self.pairing is None or first_of_pair(step):
            return None
        kept = self._select()
        order = self.pairing.second_order(count, step)
        self.prompts = None
        return take(kept, order)

    def drew_prompts(self, step: int, prompts: Prompts, host: Host) -> dict[str, np.ndarray]:
        if self.pairing is not None and first_of_pair(step):
            self.prompts, self.kept = prompts, None
            self.pairing.start(step)
        return {}

    def estimator_inputs(self, batch: StepBatch) -> Optional[EstimatorInputs]:
        return EstimatorInputs(old_log_probs=batch.trajectories.finals(batch.old_log_probs))

    def after_advantage(self, step: int, batch: StepBatch) -> StepOutput:
        result = batch.estimator_results.get(self.method.name)
        if result is None:  # the step computed no codapo advantages: the pair's selection then says so in one line
            return StepOutput()
        if self.pairing is not None and first_of_pair(step):
            # One weight per trajectory of the estimator's rows, with its prompt's uid: a prompt's w_g either way.
            self.pairing.add_weights(result.per_response["uids"], result.per_response["weights"])
        return StepOutput(metrics=dict(result.metrics),
                          dump={"codapo_weight": batch.trajectories.broadcast(result.per_response["weights"])})

    def end_step(self, step: int) -> dict[str, float]:
        if self.pairing is None:
            return {"codapo/resampled": 0.0}
        kept = float("nan")
        if first_of_pair(step):
            kept = float(len(self.pairing.select(None if self.prompts is None else self.prompts.uids)))
        return {"codapo/resampled": float(not first_of_pair(step)), "codapo/kept_prompts": kept}

    def _select(self) -> dict[str, Any]:
        """The kept prompts of the pair (selected once, from every weight the odd step recorded)."""
        if self.kept is None:
            positions = self.pairing.select(None if self.prompts is None else self.prompts.uids)
            if self.prompts is None:
                raise ResamplingStateError(NOTHING_KEPT)
            self.kept = take(self.prompts.columns, positions)
        return self.kept
