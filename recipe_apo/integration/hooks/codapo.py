"""CoDaPO in the trainer: the old policy's log-probs handed to the ``codapo`` estimator (verl passes a custom
estimator none), its ``codapo/...`` metrics and each response's weight w_g in the dump; and, with
``algorithm.codapo.resample=true``, every even step's prompts built from the previous step's kept prompts
instead of the dataloader, with ``global_step_N/codapo_state.pt`` in every odd step's checkpoint
(``recipe_apo.integration.resampling``).

With a multi-output agent loop a CoDaPO response is a trajectory, its final output
(``recipe_apo.integration.multi_output``): the log-probs handed over are the final rows' (c_g averages, over
the group's trajectories, the mean token log-prob of each final output, the output the reward scored), and
every output row of a trajectory gets its group's w_g in the dump."""

from __future__ import annotations

from typing import Any, Optional

from recipe_apo.integration import batch_fields
from recipe_apo.integration.hooks.base import RowColumns, TrainerHook
from recipe_apo.integration.multi_output import Sessions
from recipe_apo.integration.resampling import PromptResampler, first_of_pair
from recipe_apo.methods import driver_state
from recipe_apo.methods.codapo import CodapoSettings


def _uses_codapo(config: Any) -> bool:
    return str(config.algorithm.adv_estimator) == "codapo"


class CodapoHook(TrainerHook):
    @classmethod
    def wanted(cls, config: Any) -> bool:
        return _uses_codapo(config)

    def __init__(self, trainer: Any, config: Any) -> None:
        super().__init__(trainer, config)
        self.columns = RowColumns()

    def around_advantage(self, batch: Any, sessions: Sessions):
        driver_state.clear_results("codapo")
        if self.trainer.global_steps != self.columns.step:
            self.columns.clear()
        return driver_state.handed(old_log_probs=sessions.finals(batch_fields.old_log_probs(batch)))

    def after_advantage(self, batch: Any, metrics: dict, sessions: Sessions) -> None:
        result = driver_state.last_result("codapo")
        if result is not None:
            metrics.update(result.metrics)
            self.columns.add(self.trainer.global_steps, sessions, {"codapo_weight": result.per_response["weights"]})

    def dump_fields(self, batch: Any) -> dict[str, list]:
        return self.columns.for_rows(batch.keys)


class ResamplingHook(TrainerHook):
    """Steps pair by ``global_steps``: odd steps read the loader, even steps train on the kept prompts."""

    @classmethod
    def wanted(cls, config: Any) -> bool:
        return _uses_codapo(config) and CodapoSettings.from_algorithm_config(config.algorithm).resample

    def __init__(self, trainer: Any, config: Any) -> None:
        super().__init__(trainer, config)
        self.resampler = PromptResampler(CodapoSettings.from_algorithm_config(self.config.algorithm))

    @property
    def step(self) -> int:
        return self.trainer.global_steps

    def restored(self, folder: Optional[str], step: int) -> None:
        if step > 0:
            self.resampler.load(folder, step)

    def save(self, folder: str, step: int) -> None:
        self.resampler.save(folder, step)

    def replace_batch(self, num_prompts: int) -> Optional[Any]:
        if first_of_pair(self.step):
            return None
        from verl.utils import tensordict_utils as tu

        batch = self.resampler.second_batch(num_prompts, self.step)
        tu.assign_non_tensor_data(batch, "global_steps", self.step)
        return batch

    def drew_batch(self, batch: Any) -> None:
        if first_of_pair(self.step):
            self.resampler.start_pair(batch, self.step)

    def after_advantage(self, batch: Any, metrics: dict, sessions: Sessions) -> None:
        # One weight per trajectory of the estimator's rows, with its prompt's uid: a prompt's w_g either way.
        result = driver_state.last_result("codapo")
        # None: the step computed no codapo advantages; the pair's selection then says so in one line.
        if first_of_pair(self.step) and result is not None:
            self.resampler.add_weights(result.per_response["uids"], result.per_response["weights"])
