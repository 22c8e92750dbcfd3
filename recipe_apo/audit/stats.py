"""The bias audit's statistics: the group statistics (``recipe_apo.methods.group_stats``) and the presets'
replays (``recipe_apo.integration.replay``), under one name for the audit's modules."""

from recipe_apo.integration.replay import Method, method_advantages, method_named, methods, preset_methods
from recipe_apo.methods.group_stats import (
    TOKEN_MEAN,
    TOKEN_SUM_NORM,
    WEIGHT_RULES,
    closed_form,
    dead_groups,
    group_codes,
    group_rates,
    group_sums,
    length_by_outcome,
    signal_per_group,
    token_weights,
    update_mass,
)

__all__ = ["TOKEN_MEAN", "TOKEN_SUM_NORM", "WEIGHT_RULES", "Method", "closed_form", "dead_groups", "group_codes",
           "group_rates", "group_sums", "length_by_outcome", "method_advantages", "method_named", "methods",
           "preset_methods", "signal_per_group", "token_weights", "update_mass"]


def __getattr__(name: str):
    if name == "METHODS":
        return methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
