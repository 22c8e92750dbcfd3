"""A cap on the group filter's refills: ``algorithm.filter_groups.max_num_gen_batches``, which verl 0.9.1 declares
("Non-positive values mean no upper limit") and ignores (it warns so, ``trainer_base.py:205-211``).

verl's group filter (DAPO's dynamic sampling, ``algorithm.filter_groups.enable``; ``method=agpo``'s preset) drops a
step's groups whose responses all score alike and refills the step with fresh prompts until the batch is full
(``ReplayBuffer.sample`` in sync mode, ``ReplayBufferAsync.wait_for_sampleable`` in the asynchronous ones): with no
cap, a dataset the policy has solved, or cannot solve, generates forever. The authors of DAPO and AGPO (verl
#2649, ``ray_trainer.py``) raised after ``max_num_gen_batches`` generation batches without a full batch.

The recipe's trainer honours the setting, with verl's meaning of a non-positive value (no cap):

- a generation batch is ``data.train_batch_size`` prompts (verl's unit of ``filter_groups.max_inflight_gen_batches``,
  and the authors', whose scripts leave ``data.gen_batch_size`` at the train batch size); a step's own batch is its
  first, so its refills may send at most (max_num_gen_batches - 1) x train_batch_size prompts to generation
  (``budget``). Every refill verl asks for counts (verl's sync mode asks for two prompts per dropped group; the
  asynchronous modes one, also for a stale or failed group);
- a refill past the budget is withheld (``grant``), and the step goes on with the prompts already in flight, which
  may still fill it: the authors, too, stopped only after their last batch had come back;
- when verl's sampler would wait with refills withheld, nothing in flight and the batch not full, it would wait
  forever: the run stops there, before it waits, with one line (``check``, ``RefillCapError``).

Nothing here imports verl: the launch checks the setting (``from_config``), and
``recipe_apo.integration.verl_access.cap_refills`` hands the cap to verl's replay buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from recipe_apo.errors import RecipeError
from recipe_apo.integration.errors import RecipeConfigError
from recipe_apo.methods.checks import check_integer

SETTING = "algorithm.filter_groups.max_num_gen_batches"


class RefillCapError(RecipeError, RuntimeError):
    """A step's group filter reached ``max_num_gen_batches`` without a full batch: the run stops (one line)."""


@dataclass
class RefillCap:
    """The cap of one run and what its current step has used of it."""

    max_num_gen_batches: int  # N >= 1: generation batches a step may take, its own included
    train_batch_size: int     # B: prompts in a generation batch
    step: int = 0
    refilled: int = 0         # refill prompts sent to generation in this step
    withheld: int = 0         # refill prompts verl asked for in this step and did not get
    needed: int = 0           # groups the sampler is waiting for (its batch size or target count)

    @classmethod
    def from_config(cls, config: Any) -> Optional["RefillCap"]:
        """The run's cap; None when the group filter is off or the setting is <= 0 (verl's "no upper limit").
        With the filter on, a value that is not a whole number is refused with one line naming the setting (verl
        0.9.1 would fail comparing it with 0)."""
        group_filter = config.algorithm.get("filter_groups", None)
        if group_filter is None or not group_filter.get("enable", False):
            return None
        limit = check_integer(SETTING, group_filter.get("max_num_gen_batches", 0), RecipeConfigError)
        if limit <= 0:
            return None
        return cls(max_num_gen_batches=limit, train_batch_size=int(config.data.train_batch_size))

    @property
    def budget(self) -> int:
        """Refill prompts a step may send: (N - 1) x B."""
        return (self.max_num_gen_batches - 1) * self.train_batch_size

    def begin_step(self, step: int) -> None:
        self.step, self.refilled, self.withheld = int(step), 0, 0

    def grant(self, asked: int) -> int:
        """How many of the ``asked`` refill prompts go to generation: what is left of the step's budget."""
        granted = max(0, min(int(asked), self.budget - self.refilled))
        self.refilled += granted
        self.withheld += int(asked) - granted
        return granted

    def check(self, sampleable: int, in_flight: int) -> None:
        """Called where verl's sampler is about to wait for more groups, with the groups it can sample
        (``sampleable``: those with a signal) and those still being generated (``in_flight``): raises when refills
        were withheld and nothing can come."""
        if self.withheld and in_flight == 0:
            raise RefillCapError(self.message(sampleable))

    def message(self, sampleable: int) -> str:
        batches = "batch" if self.max_num_gen_batches == 1 else "batches"
        return (
            f"{SETTING}={self.max_num_gen_batches}: step {self.step} generated {self.max_num_gen_batches} "
            f"{batches} of data.train_batch_size={self.train_batch_size} prompts and has {sampleable} groups with a "
            f"signal of the {self.needed} it needs (the group filter drops every group whose responses all score "
            "alike: the policy solves, or fails, nearly every prompt it draws); stopped instead of refilling "
            f"without end: train on prompts the policy sometimes solves, raise {SETTING}, set it to 0 for no cap, "
            "or turn the filter off (algorithm.filter_groups.enable=false)"
        )

    def announcement(self) -> str:
        """The line the trainer prints when it installs the cap (verl's "is ignored" warning is dropped)."""
        return (
            f"recipe-apo: {SETTING}={self.max_num_gen_batches}: a step whose group filter has not filled its batch "
            f"after {self.max_num_gen_batches} generation batches of {self.train_batch_size} prompts stops the run "
            "(verl 0.9.1 ignores the setting; the recipe's trainer honours it)"
        )
