"""AGPO as its authors built it (arXiv 2503.15952, "an adaptive loss function to mitigate training fluctuation and
token inefficiency"; their code: verl pull request #2649 at 4cbea10): ``method=agpo``.

- ``estimator``: the ``agpo`` advantage estimator: the rewards on the authors' scale (+1 right, -1 wrong, as their
  data's scorer, ``algorithm.agpo.wrong_reward``), the length bonus on a group's correct responses, +1 / -1 for a
  group whose rewards are all 1 / all 0 (on -1/+1 no group is all 0), GRPO's advantages otherwise;
- ``loss``: the ``agpo`` policy loss: verl's clipped surrogate over the tokens with A != 0, clipped below at 0;
- ``settings``: ``algorithm.agpo``;
- ``launch``: what the launch refuses (a KL penalty in the rewards, the zero-variance rescale);
- ``runtime``: ``agpo/*`` metrics and each row's training reward in the rollout dump.

Its preset (``conf/method/agpo.yaml``) takes the authors' published script: verl's group filter on, clip
0.2 / 0.28, token-mean, no KL. Each departure from the authors' code is stated where it is made.
"""

from __future__ import annotations

from typing import Any

from recipe_apo.methods.agpo.settings import AgpoSettings
from recipe_apo.methods.base import Method, Metric, setting

ESTIMATOR = "agpo"
LOSS = "agpo"


def uses_agpo(config: Any) -> bool:
    """A run of ``config`` computes AGPO's advantages (its length bonus and +-1 rule)."""
    return str(setting(config, "algorithm.adv_estimator")) == ESTIMATOR


METHOD = Method(
    name="agpo",
    title="AGPO",
    active=uses_agpo,
    presets=("agpo",),
    settings=AgpoSettings,
    order=3,
    metrics={
        "shaped_reward_mean": Metric("R~, the training reward with the length bonus on algorithm.agpo.wrong_reward's "
                                     "scale (-1/+1 by default: 2 x accuracy - 1 plus the bonuses), mean over the "
                                     "step's responses", headline=True),
        "bonus_share": "share of the step's responses given a length bonus",
        "saturated_share": "share of the step's responses in groups given +1 or -1 (all rewards 1, or all 0: only "
                           "with wrong_reward=0)",
    },
)

# Its parts declare themselves into METHOD where they are defined (``@METHOD.estimator(...)``, ...).
from recipe_apo.methods.agpo import estimator, launch, loss, runtime  # noqa: E402, F401
