"""The zero-variance denominator, the loss-mask piece of AGPO (as TRL's #6365 implements it; ``method=agpo`` is AGPO
itself), as a modifier of any group estimator: ``algorithm.zero_variance=exclude``.

- ``rescale``: the step's scale B / B_live (T / T_live for token-mean) on the live groups' advantages, and how far
  it is off for one mini-batch;
- ``launch``: what the launch refuses (a mode with no denominator, KL-penalised rewards, plain verl's trainer, the
  testbed's ``exact``);
- ``runtime``: the rescale after every other method's advantages, ``zero_variance/*`` metrics; in the testbed, the
  reference ``exact`` (each mini-batch's own denominators) and how far ``exclude`` is off per mini-batch.
"""

from __future__ import annotations

from typing import Any

from recipe_apo.methods.base import Method, Metric, setting

# "exact" is the testbed's reference, which verl's actor cannot run (its denominators are the mini-batch's).
ACTIVE_MODES = ("exclude", "exact")


def uses_zero_variance(config: Any) -> bool:
    """A run of ``config`` takes the groups whose rewards are all equal out of the loss's denominator."""
    return str(setting(config, "algorithm.zero_variance", "keep")) in ACTIVE_MODES


METHOD = Method(
    name="zero_variance",
    title="zero-variance denominator",
    active=uses_zero_variance,
    rescales_advantages=True,
    metrics={
        "scale": "B / B_live (T / T_live for token-mean), the live advantages' factor",
        "live_share": "share of the step's responses (tokens for token-mean) in groups with a signal",
        "ratio_dev_mean": Metric("testbed: mean over the mini-batches of abs(their live share / the step's - 1) "
                                 "(0: exact)", league=True),
        "ratio_dev_max": Metric("testbed: the largest over the step's mini-batches of abs(their live share / the "
                                "step's - 1)", league=True, peak=True),
    },
)

# Its parts declare themselves into METHOD where they are defined (``@METHOD.runtime``, ...).
from recipe_apo.methods.zero_variance import launch, runtime  # noqa: E402, F401
