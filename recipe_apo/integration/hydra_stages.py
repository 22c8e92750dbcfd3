"""Hydra's ``compose`` in its two stages, the first one cached: for the tools that compose hundreds of configs (the
testbed's league; the tests of the recipe's config).

Hydra composes in two stages: the defaults tree (the file of each config group: ``method=``, ``scenario=``,
``task=``, ``rehearsal=``, and ``hydra.*``) merged into one config, then the key overrides applied to it
(``ConfigLoaderImpl._apply_overrides_to_config``, the function ``compose`` itself runs). The first stage is nearly
all of a compose (it reads and merges the YAML files, verl's among them for the recipe's config), and a league asks
for ~90 configs of a few dozen group choices (``scripts/bench_compose.py``: its plan in 0.52x Hydra's time).
``compose_in_two_stages`` composes the first stage once per config, set of group choices and config search path (by
``compose`` itself), applies the key overrides to a copy, and returns the config ``compose`` returns, with the same
refusals (tests/testbed/test_configs.py and tests/test_composing.py hold the two side by side).
``clear`` forgets the first stages: the group files (a preset) or the ConfigStore's nodes may have changed.
"""

from __future__ import annotations

import copy

from omegaconf import DictConfig

_FIRST_STAGES: dict[tuple, DictConfig] = {}


def compose_in_two_stages(config_name: str, overrides: list[str]) -> DictConfig:
    """``hydra.compose(config_name, overrides)`` inside an initialized Hydra, its first stage cached."""
    from hydra import compose
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    apply = getattr(ConfigLoaderImpl, "_apply_overrides_to_config", None)
    if apply is None or not GlobalHydra.instance().is_initialized():  # another Hydra: compose as it is
        return compose(config_name=config_name, overrides=list(overrides))
    loader = GlobalHydra.instance().hydra.config_loader
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    groups = [o for o in parsed if o.key_or_group.startswith("hydra")
              or (loader.repository.group_exists(o.key_or_group) and not isinstance(o.value(), dict))]
    keys = [o for o in parsed if o not in groups]
    where = tuple((source.provider, source.path) for source in loader.get_sources())
    stage = (config_name, where, tuple(o.input_line for o in groups))
    if stage not in _FIRST_STAGES:
        _FIRST_STAGES[stage] = compose(config_name=config_name, overrides=list(stage[2]))
    config = copy.deepcopy(_FIRST_STAGES[stage])
    apply(keys, config)
    return config


def first_stages() -> int:
    """How many first stages are held."""
    return len(_FIRST_STAGES)


def clear() -> None:
    _FIRST_STAGES.clear()
