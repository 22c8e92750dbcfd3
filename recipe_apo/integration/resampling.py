"""CoDaPO's prompt resampling in verl's V1 trainer: the state the recipe's trainer keeps between the two steps
of a pair, and its checkpoint file (``recipe_apo.methods.codapo`` holds the rule itself).

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


def first_of_pair(step: int) -> bool:
    """Odd steps (verl counts from 1) read the dataloader; even steps train on the previous step's kept prompts."""
    return step % 2 == 1


class PromptResampler:
    """Between the two steps of a pair: the loader batch of the odd step, the weights its advantage step
    computed, and the kept prompts (a TensorDict of the loader's fields, one row per kept prompt)."""

    def __init__(self, settings: CodapoSettings) -> None:
        self.settings = settings
        self.prompts = None  # the odd step's loader batch (TensorDict)
        self.response_uids: list[np.ndarray] = []
        self.response_weights: list[np.ndarray] = []
        self.kept = None  # TensorDict of the kept prompts, once selected
        self.kept_step: Optional[int] = None  # the odd step the prompts (to be) kept come from

    def start_pair(self, prompts: Any, step: int) -> None:
        """An odd step's loader batch, before it goes to the rollout."""
        self.prompts, self.kept, self.kept_step = prompts, None, step
        self.response_uids, self.response_weights = [], []

    def add_weights(self, uids: np.ndarray, weights: np.ndarray) -> None:
        """One advantage computation's per-response uids and w_g (verl may split a step into several)."""
        if self.prompts is not None and self.kept is None:
            self.response_uids.append(np.asarray(uids, dtype=object))
            self.response_weights.append(np.asarray(weights, dtype=np.float64))

    def select(self):
        """The kept prompts of the pair (selected once, from every weight the odd step recorded)."""
        from verl.utils import tensordict_utils as tu

        if self.kept is None:
            if self.prompts is None or not self.response_uids:
                raise ResamplingStateError(
                    "codapo resampling: no weighted step to resample from (the odd step computed no codapo "
                    "advantages); set algorithm.codapo.resample=false or algorithm.adv_estimator=codapo"
                )
            positions = select_prompts(
                list(self.prompts["uid"]),
                np.concatenate(self.response_uids),
                np.concatenate(self.response_weights),
                self.settings.percentile,
            )
            self.kept = tu.index_select_tensor_dict(self.prompts, torch.as_tensor(positions, dtype=torch.long))
        return self.kept

    def second_batch(self, batch_size: int, step: int):
        """The even step's prompts: each kept prompt ``repeat_count`` times in place, each copy a fresh uid."""
        from verl.utils import tensordict_utils as tu

        kept = self.select()
        if self.kept_step != step - 1:
            raise ResamplingStateError(
                f"codapo resampling: step {step} needs the prompts kept at step {step - 1}, "
                f"but the kept prompts are from step {self.kept_step}"
            )
        order = resample_order(np.arange(len(kept)), batch_size, self.settings.repeat_count)
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
        self.prompts, self.kept, self.kept_step = None, state["kept"], step


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
