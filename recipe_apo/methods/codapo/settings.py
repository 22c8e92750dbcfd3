"""CoDaPO's settings, ``algorithm.codapo`` (CoDaPO's own defaults, tmlr-group/CoDaPO at 210c205)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from recipe_apo.methods.checks import check_flag, check_integer, check_number
from recipe_apo.methods.errors import MethodConfigError
from recipe_apo.methods.settings import read_settings


class CodapoConfigError(MethodConfigError):
    """A setting under ``algorithm.codapo`` is invalid; the message names the key."""


# Upper bounds far beyond CoDaPO's values (0.1 and 4), there so that no accepted value overflows or exhausts
# memory: w_g = c_g d_w + weight_offset multiplies every advantage, so an offset of 1e39 made them inf; a count
# of copies past any batch of prompts only fills the batch with the first kept prompt.
MAX_WEIGHT_OFFSET = 1e3
MAX_REPEAT_COUNT = 100_000


@dataclass(frozen=True)
class CodapoSettings:
    """The ``algorithm.codapo`` settings (CoDaPO's defaults), each checked for its type and bounds."""

    # Floor of w_g = c_g d_w + weight_offset (CoDaPO's `weight_offset`, 0.1).
    weight_offset: float = 0.1
    # The second step of a pair keeps the prompts with w_g >= this quantile of the first step's weights.
    percentile: float = 0.75
    # Copies of each kept prompt in the second step's batch (CoDaPO: 4 = 1 / (1 - percentile)).
    repeat_count: int = 4
    # true: every loader batch serves two steps (the second one resampled); false: the weighting alone.
    resample: bool = True

    def __post_init__(self) -> None:
        check_number("algorithm.codapo.weight_offset", self.weight_offset, CodapoConfigError, low=0.0,
                     high=MAX_WEIGHT_OFFSET)
        check_number("algorithm.codapo.percentile", self.percentile, CodapoConfigError, low=0.0, high=1.0,
                     low_open=True, high_open=True)
        check_integer("algorithm.codapo.repeat_count", self.repeat_count, CodapoConfigError, low=1,
                      high=MAX_REPEAT_COUNT)
        check_flag("algorithm.codapo.resample", self.resample, CodapoConfigError)

    @classmethod
    def from_algorithm_config(cls, algorithm_config: Any) -> "CodapoSettings":
        """Read ``algorithm_config.codapo`` (an OmegaConf node, a dict, or absent); unknown keys are refused."""
        return read_settings(cls, algorithm_config, "codapo", CodapoConfigError)

    def recommended_repeat_count(self) -> float:
        """1 / (1 - percentile): the copies that refill the batch from the kept share of its prompts evenly."""
        return 1.0 / (1.0 - self.percentile)

    def tiling_warning(self) -> Optional[str]:
        """CoDaPO's own warning (its trainer's ``_create_dataloader``) when repeat_count is more than 0.5 away
        from ``recommended_repeat_count``, as one line; None when the two agree."""
        recommended = self.recommended_repeat_count()
        if abs(self.repeat_count - recommended) <= 0.5:
            return None
        return (
            f"algorithm.codapo.repeat_count={self.repeat_count} is more than 0.5 away from 1 / (1 - "
            f"algorithm.codapo.percentile) = {recommended:.2f} (percentile {self.percentile:g}): the resampled step "
            "will not tile the batch evenly, so the kept prompts are over- or under-sampled unevenly (CoDaPO's "
            f"code warns the same); consider repeat_count={round(recommended)}"
        )
