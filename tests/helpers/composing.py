"""The recipe's config as ``python -m recipe_apo.main`` composes it, for tests that compose it hundreds of times:
Hydra's compose in its two stages, the first (the defaults tree: about 30 YAML files of verl's, about 0.6 s) once per
set of group choices (``recipe_apo.integration.hydra_stages``, which the testbed's league uses too), the key
overrides applied to a copy: the same config Hydra's ``compose`` returns (``test_composing.py`` holds the two side
by side), at a tenth of the cost.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

CONFIG_MODULE, CONFIG_NAME = "recipe_apo.conf", "apo_trainer"
# What a dry run needs beyond the recipe's defaults to pass verl's own config check (the launch runs it, dry runs
# too): verl leaves the micro-batch sizes unset and refuses fixed ones unset; dynamic batch sizes need none.
LAUNCHABLE = ("actor_rollout_ref.actor.use_dynamic_bsz=true",)


def hydra_compose(overrides, config_name: str = CONFIG_NAME) -> DictConfig:
    """Hydra's own compose, as the entry point runs it (the reference for ``compose_recipe``)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        return compose(config_name, overrides=list(overrides))


def compose_recipe(*overrides: str, resolve: bool = True, config_name: str = CONFIG_NAME) -> DictConfig:
    """The composed config (resolved unless ``resolve=False``, as ``recipe_apo.main`` resolves it)."""
    from hydra import initialize_config_module

    from recipe_apo.integration.hydra_stages import compose_in_two_stages

    with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
        config = compose_in_two_stages(config_name, list(overrides))
    if resolve:
        OmegaConf.resolve(config)
    return config
