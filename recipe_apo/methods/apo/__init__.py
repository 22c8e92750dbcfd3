"""APO, Adaptive Policy Optimization (the paper, section 4): ``method=apo``.

- ``estimator``: the ``apo`` advantage estimator, A_i^eff = Phi_i A_i against the capability anchor;
- ``anchor``: C_t and its rate eta_t, one book of anchors per driver process;
- ``success``: s(R), the success a reward stands for;
- ``loss``: the ``apo`` policy loss (the soft gate f(r) with tau_+/-, and 1/L0) and its one-sided form
  ``apo_one_sided``;
- ``settings``: ``algorithm.apo``;
- ``launch``: the launch's checks of an APO run;
- ``runtime``: the anchor over a run (fresh, or the checkpoint's ``apo_state.json``), the per-source anchors'
  data sources, the ``apo/*`` metrics, Phi_i and C_t in the rollout dump.
"""

from __future__ import annotations

from typing import Any

from recipe_apo.methods.apo.settings import ApoSettings
from recipe_apo.methods.base import Method, Metric, setting

ESTIMATOR = "apo"
LOSS = "apo"
ONE_SIDED_LOSS = "apo_one_sided"


def uses_apo(config: Any) -> bool:
    """A run of ``config`` computes APO's advantages (its anchor runs)."""
    return str(setting(config, "algorithm.adv_estimator")) == ESTIMATOR


METHOD = Method(
    name="apo",
    title="APO",
    active=uses_apo,
    presets=("apo",),
    settings=ApoSettings,
    plain_verl=True,
    order=1,
    featured=True,
    metrics={
        "anchor": Metric("C_t, the capability anchor after the step", headline=True),
        "anchor_rate": "eta_t, the rate the anchor moved at",
        "anchor_rate_at_floor": "1 when eta_t was at its floor eta_min (the anchor then moves as a plain EMA)",
        "batch_success": Metric("y_t, the step's success rate the anchor moved with", headline=True),
        "harder_group_share": "share of groups below the anchor (Delta_g < 0)",
        "uniform_group_share": "share of groups whose centered rewards are all 0",
        "weight_pos_mean": Metric("mean Phi_i of the positive advantages", headline=True),
        "weight_neg_mean": Metric("mean Phi_i of the negative advantages", headline=True),
    },
)

# Its parts declare themselves into METHOD where they are defined (``@METHOD.estimator(...)``, ...).
from recipe_apo.methods.apo import estimator, launch, loss, runtime  # noqa: E402, F401
