"""Registers the recipe's methods with verl: every advantage estimator and policy loss a method of
``recipe_apo.methods.catalog`` declares where it defines it (``@METHOD.estimator("apo")``, ``@METHOD.loss("apo")``).
The methods declare them with their own decorators, not verl's (``register_adv_est`` at a definition would import
verl, which imports this plugin, from inside a method: a circle), and this module registers them with verl.

This module is the target of the ``verl.plugins`` entry point, so ``import verl`` imports it in the driver and
in every Ray worker; the recipe's own entry points import it too (which also covers
``VERL_USE_EXTERNAL_PLUGINS=none``). verl swallows a failing plugin import with a DEBUG log; this module therefore
reports its own failure as an ERROR naming the cause (and re-raises), and warns when the installed verl is not the
release this plugin is pinned to.

Each name registers on its own: a name that verl (or another plugin) already holds with a function of its own is
left to it, recorded in ``TAKEN`` and warned about, and every other name still registers; the launch then refuses a
run that names a taken one (``integration.validation``), so that a run never gets another estimator or loss than
the recipe's under the recipe's name. (verl pull request #7497 registers a ``codapo`` of its own.)

No module of a method imports verl at its top: ``import verl`` loads this plugin, which imports every method's
package and with it every module that declares a part (``recipe_apo.methods.catalog``), so a method module that
imported verl first would be registered half-initialised.
"""

from __future__ import annotations

import logging
from typing import Optional

from recipe_apo.methods import catalog

logger = logging.getLogger("recipe_apo")

PINNED_VERL_VERSION = "0.9.1"


def verl_version_warning(installed: Optional[str]) -> Optional[str]:
    """The warning to give for an installed verl version, or None when it is the pinned one."""
    if installed == PINNED_VERL_VERSION:
        return None
    return (
        f"recipe-apo is built and tested against verl=={PINNED_VERL_VERSION} but verl {installed} is installed; "
        f"loss aggregation and trainer hooks may differ. Install verl=={PINNED_VERL_VERSION}."
    )


# (kind, name) -> the function that holds a name the recipe wanted, as "module.qualname".
TAKEN: dict[tuple[str, str], str] = {}


def _register(registry: dict, register, name: str, fn, kind: str) -> None:
    existing = registry.get(name)
    if existing is not None and existing is not fn:
        holder = f"{getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)}"
        if TAKEN.get((kind, name)) != holder:
            TAKEN[(kind, name)] = holder
            logger.warning("recipe-apo: another %s is already registered as '%s' (%s); the recipe's is not, and a "
                           "run that names '%s' is refused", kind, name, holder, name)
        return
    register(name)(fn)


def taken_message(kind: str, key: str, name: str) -> str | None:
    """The one-line refusal of a run whose ``key=name`` names a recipe's estimator or loss that another function
    holds in this process (``TAKEN``), or None."""
    holder = TAKEN.get((kind, name))
    if holder is None:
        return None
    article = "an" if kind[0] in "aeiou" else "a"
    return (f"{key}={name}: this verl registers {article} {kind} of its own under that name ({holder}), not the "
            f"recipe's, which could not register; install verl=={PINNED_VERL_VERSION}, the release the recipe is "
            "built for")


def register() -> None:
    """Register the estimators and the losses in this process; a second call is a no-op."""
    import verl
    from verl.trainer.ppo import core_algos

    # Every method loaded (its parts declare themselves on import) before anything is registered: a failure
    # registers nothing.
    estimators, losses = catalog.estimators(), catalog.losses()
    for name, fn in estimators.items():
        _register(core_algos.ADV_ESTIMATOR_REGISTRY, core_algos.register_adv_est, name, fn, "advantage estimator")
    for name, fn in losses.items():
        _register(core_algos.POLICY_LOSS_REGISTRY, core_algos.register_policy_loss, name, fn, "policy loss")
    warning = verl_version_warning(getattr(verl, "__version__", None))
    if warning:
        logger.warning(warning)


try:
    # Everything this plugin registers: the start-up node check looks for each name on every Ray node.
    ESTIMATORS, LOSSES = tuple(catalog.estimators()), tuple(catalog.losses())
    register()
except Exception as exc:
    logger.error(
        "recipe-apo: registering the methods' advantage estimators and policy losses with verl failed (%s: %s); "
        "none of them (algorithm.adv_estimator, policy_loss.loss_mode) will be available in this process",
        type(exc).__name__, exc, exc_info=True,
    )
    raise
