"""CoDaPO (tmlr-group/CoDaPO): ``method=codapo``, GRPO's advantages times a per-group confidence-difficulty weight,
and the highest-weighted prompts trained again every second step.

- ``estimator``: the ``codapo`` advantage estimator (w_g = c_g d_w + offset) and the resampling rule (which prompts
  are kept, in which order the second step repeats them);
- ``settings``: ``algorithm.codapo``;
- ``launch``: the launch's checks of a CoDaPO run;
- ``runtime``: the old log-probs handed to the estimator, ``codapo/*`` metrics, w_g in the rollout dump, and the
  pairs of steps with their kept prompts (``codapo_state.json`` in an odd step's checkpoint).
"""

from __future__ import annotations

from typing import Any

from recipe_apo.methods.base import Method, Metric, setting
from recipe_apo.methods.codapo.settings import CodapoSettings

ESTIMATOR = "codapo"


def uses_codapo(config: Any) -> bool:
    """A run of ``config`` computes CoDaPO's advantages."""
    return str(setting(config, "algorithm.adv_estimator")) == ESTIMATOR


METHOD = Method(
    name="codapo",
    title="CoDaPO",
    active=uses_codapo,
    presets=("codapo",),
    settings=CodapoSettings,
    order=2,
    metrics={
        "weight_mean": "w_g, mean over the step's groups",
        "confidence_mean": "c_g, the old policy's confidence, mean over groups",
        "difficulty_weight_mean": "d_w = 4 acc (1 - acc), mean over groups",
        "accuracy_mean": "acc_g, the share of rewards exactly 1.0, mean over groups",
        "resampled": Metric("1 when the step trained on the kept prompts of the step before", league=True),
        "kept_prompts": Metric("prompts kept for the next step (first step of a pair)", league=True),
    },
)

# Its parts declare themselves into METHOD where they are defined (``@METHOD.estimator(...)``, ...).
from recipe_apo.methods.codapo import estimator, launch, runtime  # noqa: E402, F401
