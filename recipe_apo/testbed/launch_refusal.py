"""What the recipe's launch refuses of a testbed config: every active method's launch checks, run on the config as
the recipe's sync trainer would run it (``check_launch``), refused as a ``LaunchRefusal`` in the launch's own line.
"""

from __future__ import annotations

from typing import Any

from recipe_apo.errors import RecipeError
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.setting_rules import whole


class LaunchRefusal(TestbedSettingError):
    """A testbed config that the recipe's launch refuses (a method's ``launch_checks``); the message is the
    launch's one line."""


def launch_of(cfg: Any) -> Any:
    """The ``Launch`` a method's launch checks get for a testbed config: the config (interpolations resolved) as the
    recipe's sync trainer runs it, ``testbed`` true and ``staleness`` its lag (``methods.base.Launch``)."""
    from omegaconf import OmegaConf

    from recipe_apo.methods.base import Launch

    values = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    view = OmegaConf.create({**values, "trainer": {"v1": {"trainer_mode": "sync"}}})
    staleness = values.get("staleness", 0)
    return Launch(view, recipe_trainer=True, verl_mode="sync", testbed=True,
                  staleness=staleness if whole(staleness) else 0)


def check_launch(cfg: Any) -> None:
    """Refuse, as a ``LaunchRefusal`` in the launch's own line, a testbed config of a method whose run the recipe's
    launch refuses: every active method's launch checks (``@METHOD.launch_check``), run as the launch runs them
    (``launch_of``). A check skips only what the testbed runs on purpose where the recipe cannot
    (``algorithm.zero_variance=exact``; R2PO's model folder: the testbed's policy is its own), and the testbed's
    ``staleness`` counts as the asynchronous mode it stands for where a method's reason holds for it (R2PO: a stale
    round samples from the head of the phase before the switch)."""
    from recipe_apo.methods import catalog

    launch = launch_of(cfg)
    for method in catalog.active(launch.config):
        for check in method.checks():
            try:
                check(launch)
            except RecipeError as exc:
                raise LaunchRefusal(" ".join(str(exc).split())) from None
