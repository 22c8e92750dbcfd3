"""Registers the recipe's methods with verl: the ``apo`` and ``codapo`` advantage estimators and the ``apo``,
``apo_one_sided`` and ``agpo_clip`` policy losses.

This module is the target of the ``verl.plugins`` entry point, so ``import verl`` imports it in the driver and
in every Ray worker. verl swallows a failing plugin import with a DEBUG log; this module therefore reports
its own failure as an ERROR naming the cause (and re-raises), and warns when the installed verl is not the
release this plugin is pinned to.
"""

from __future__ import annotations

import logging
from typing import Optional

logger = logging.getLogger("recipe_apo")

PINNED_VERL_VERSION = "0.9.1"
NAME = "apo"
CODAPO = "codapo"
ONE_SIDED = "apo_one_sided"
AGPO_CLIP = "agpo_clip"
# Everything this plugin registers: the start-up node check looks for each name on every Ray node.
ESTIMATORS = (NAME, CODAPO)
LOSSES = (NAME, ONE_SIDED, AGPO_CLIP)


def verl_version_warning(installed: Optional[str]) -> Optional[str]:
    """The warning to give for an installed verl version, or None when it is the pinned one."""
    if installed == PINNED_VERL_VERSION:
        return None
    return (
        f"recipe-apo is built and tested against verl=={PINNED_VERL_VERSION} but verl {installed} is installed; "
        f"loss aggregation and trainer hooks may differ. Install verl=={PINNED_VERL_VERSION}."
    )


def _register(registry: dict, register, name: str, fn, kind: str) -> None:
    existing = registry.get(name)
    if existing is not None and existing is not fn:
        raise RuntimeError(
            f"another {kind} is already registered as '{name}' "
            f"({getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)})"
        )
    register(name)(fn)


def register() -> None:
    """Register the estimators and the loss in this process; a second call is a no-op."""
    import verl
    from verl.trainer.ppo import core_algos

    from recipe_apo.methods.agpo_loss import compute_policy_loss_agpo_clip
    from recipe_apo.methods.apo import apo_outcome_advantage
    from recipe_apo.methods.apo_loss import compute_policy_loss_apo, compute_policy_loss_apo_one_sided
    from recipe_apo.methods.codapo import codapo_outcome_advantage

    _register(core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.register_adv_est, NAME, apo_outcome_advantage,
              "advantage estimator")
    _register(core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.register_adv_est, CODAPO, codapo_outcome_advantage,
              "advantage estimator")
    _register(core_algos.POLICY_LOSS_REGISTRY, core_algos.register_policy_loss, NAME, compute_policy_loss_apo,
              "policy loss")
    _register(core_algos.POLICY_LOSS_REGISTRY, core_algos.register_policy_loss, ONE_SIDED,
              compute_policy_loss_apo_one_sided, "policy loss")
    _register(core_algos.POLICY_LOSS_REGISTRY, core_algos.register_policy_loss, AGPO_CLIP,
              compute_policy_loss_agpo_clip, "policy loss")
    warning = verl_version_warning(getattr(verl, "__version__", None))
    if warning:
        logger.warning(warning)


try:
    register()
except Exception as exc:
    logger.error(
        "recipe-apo: registering the 'apo' and 'codapo' advantage estimators and the 'apo', 'apo_one_sided' and "
        "'agpo_clip' policy losses with verl failed (%s: %s); algorithm.adv_estimator=apo|codapo and "
        "policy_loss.loss_mode=apo|apo_one_sided|agpo_clip will not be available "
        "in this process",
        type(exc).__name__,
        exc,
        exc_info=True,
    )
    raise
