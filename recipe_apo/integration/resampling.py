"""CoDaPO's prompt resampling in verl's V1 trainer: the pairing of steps (``StepPairing``, which the CPU testbed
runs too), the state the recipe's trainer keeps between the two steps of a pair, and its checkpoint file
(``recipe_apo.methods.codapo`` holds the rule itself).

Steps pair by ``global_steps``: an odd step takes its prompts from verl's dataloader and leaves the kept
prompts; the even step after it trains on them, repeated, without touching the dataloader. verl's batch size
and step count stay as they are, so a run of N steps reads N/2 loader batches (CoDaPO's own trainer doubles
the steps of an epoch instead). Pairing by step number, not by a counter, is what lets a resume land in the
middle of a pair: a checkpoint of an odd step holds the kept prompts (``codapo_state.pt``), and the resumed run
trains the even step on them.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Optional

import numpy as np
import torch

from recipe_apo.integration.errors import ResamplingStateError, cause_of
from recipe_apo.methods.codapo import CodapoSettings, resample_order, select_prompts

STATE_FILE = "codapo_state.pt"
STATE_VERSION = 1
NOTHING_KEPT = ("codapo resampling: no weighted step to resample from (the odd step computed no codapo advantages); "
                "set algorithm.codapo.resample=false or algorithm.adv_estimator=codapo")


def first_of_pair(step: int) -> bool:
    """Odd steps (verl counts from 1) read the dataloader; even steps train on the previous step's kept prompts."""
    return step % 2 == 1


class StepPairing:
    """The pairing of CoDaPO's steps on prompt positions, with no batch type: the trainer's ``PromptResampler``
    runs it on verl's TensorDicts and the CPU testbed on its prompt tensors, so both keep and repeat the same
    prompts for the same weights.

    A first step (``first_of_pair``) ``start``s a pair and records the per-response weights of its advantage
    computations (``add_weights``); ``select`` keeps the positions of its prompts whose w_g reaches the
    percentile (``recipe_apo.methods.codapo.select_prompts``), once; the step after it trains on
    ``second_order``: positions among the kept prompts, each ``repeat_count`` times in place."""

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


class PromptResampler:
    """Between the two steps of a pair: the loader batch of the odd step and its kept prompts (a TensorDict of
    the loader's fields, one row per kept prompt), which prompts ``StepPairing`` keeps and repeats."""

    def __init__(self, settings: CodapoSettings) -> None:
        self.settings = settings
        self.pairing = StepPairing(settings)
        self.prompts = None  # the odd step's loader batch (TensorDict), until the even step
        self.kept = None  # TensorDict of the kept prompts, once selected

    @property
    def kept_step(self) -> Optional[int]:
        """The odd step the prompts (to be) kept come from."""
        return self.pairing.kept_step

    def start_pair(self, prompts: Any, step: int) -> None:
        """An odd step's loader batch, before it goes to the rollout."""
        self.prompts, self.kept = prompts, None
        self.pairing.start(step)

    def add_weights(self, uids: np.ndarray, weights: np.ndarray) -> None:
        """One advantage computation's per-response uids and w_g (verl may split a step into several)."""
        self.pairing.add_weights(uids, weights)

    def select(self):
        """The kept prompts of the pair (selected once, from every weight the odd step recorded)."""
        from verl.utils import tensordict_utils as tu

        if self.kept is None:
            positions = self.pairing.select(None if self.prompts is None else self.prompts["uid"])
            self.kept = tu.index_select_tensor_dict(self.prompts, torch.as_tensor(positions, dtype=torch.long))
        return self.kept

    def second_batch(self, batch_size: int, step: int):
        """The even step's prompts: each kept prompt ``repeat_count`` times in place, each copy a fresh uid."""
        from verl.utils import tensordict_utils as tu

        kept = self.select()
        order = self.pairing.second_order(batch_size, step)
        batch = tu.index_select_tensor_dict(kept, torch.as_tensor(order, dtype=torch.long))
        tu.assign_non_tensor_stack(batch, "uid", [str(uuid.uuid4()) for _ in range(len(order))])
        self.prompts = None
        return batch

    def save(self, folder: str, step: int) -> None:
        """Write the kept prompts into an odd step's checkpoint folder (nothing to keep after an even step)."""
        if not first_of_pair(step):
            return
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, STATE_FILE)
        torch.save({"version": STATE_VERSION, "step": step, "kept": self.select()}, path + ".tmp")
        os.replace(path + ".tmp", path)

    def load(self, folder: str, step: int) -> None:
        """Restore the kept prompts of a checkpoint of odd ``step``; a missing, unreadable or foreign file raises
        ``ResamplingStateError`` naming it and the way out, and restores nothing."""
        if not first_of_pair(step):
            return
        path = os.path.join(folder, STATE_FILE)
        way_out = (f"step {step} is the first of a CoDaPO pair and step {step + 1} trains on its kept prompts; "
                   "resume from an even step's checkpoint (trainer.resume_mode=resume_path), or set "
                   "algorithm.codapo.resample=false")
        try:
            state = torch.load(path, weights_only=False)
        except FileNotFoundError:
            raise ResamplingStateError(f"{path} is missing: {way_out}") from None
        except Exception as exc:  # pickle's, zipfile's and torch's own errors all say "not this file"
            raise ResamplingStateError(f"{path} is unreadable ({cause_of(exc)}): {way_out}") from None
        problem = _state_problem(state, step)
        if problem:
            raise ResamplingStateError(f"{path} is not the kept prompts of step {step} ({problem}): {way_out}")
        self.prompts, self.kept = None, state["kept"]
        self.pairing.restore(len(state["kept"]), step)


def _state_problem(state: Any, step: int) -> Optional[str]:
    """What makes ``state`` other than what ``save`` wrote for ``step`` (None: nothing)."""
    from tensordict import TensorDictBase

    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a mapping"
    if state.get("version") != STATE_VERSION or state.get("step") != step:
        return f"version {state.get('version')!r}, step {state.get('step')!r}"
    kept = state.get("kept")
    if not isinstance(kept, TensorDictBase) or len(kept.batch_size) != 1:
        return f"kept is a {type(kept).__name__}, not a batch of prompts"
    if kept.batch_size[0] == 0:
        return "no kept prompt"
    return None
