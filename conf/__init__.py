"""The recipe's Hydra configs, installed as ``recipe_apo.conf`` (``pkg://recipe_apo.conf``).

Hydra imports this package to read its files, and that stores ``method_settings`` in Hydra's ConfigStore: every
method's settings (``algorithm.<key>``) at the defaults its settings dataclass declares, each setting documented
there (``recipe_apo.methods.<method>.settings``). ``apo_trainer.yaml`` and ``testbed.yaml`` take it in their
defaults lists, so no YAML file holds a copy of the defaults, and a new method's settings appear in both.
"""

from dataclasses import asdict

from hydra.core.config_store import ConfigStore

from recipe_apo.methods import catalog

METHOD_SETTINGS = "method_settings"


def method_settings() -> dict:
    """``{"algorithm": {<settings_key>: <the declared defaults>}}`` of every method with settings."""
    return {"algorithm": {m.settings_key: asdict(m.settings()) for m in catalog.methods() if m.settings is not None}}


ConfigStore.instance().store(name=METHOD_SETTINGS, node=method_settings())
