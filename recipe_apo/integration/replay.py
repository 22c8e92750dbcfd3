"""A method's advantages on a step's scores, as verl's ``compute_advantage`` returns them for one of the recipe's
presets: what the bias audit and the CPU testbed replay (``recipe_apo.methods.group_stats`` measures them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import OmegaConf

from recipe_apo.integration import presets
from recipe_apo.methods.group_stats import WEIGHT_RULES


@dataclass(frozen=True)
class Method:
    """One method's estimator and aggregation, as the recipe's presets (``conf/method/``) set them; ``name`` is
    the preset's title (``GRPO``, ``Dr. GRPO``, ``APO``)."""

    name: str
    adv_estimator: str
    norm_adv_by_std_in_grpo: bool
    loss_agg_mode: str


def preset_methods() -> tuple[Method, ...]:
    """The methods the audit replays: the recipe's presets (``recipe_apo.integration.presets``), as the recipe
    composes them, in their order, that a replay from a step's scores and groups alone can run.

    Left out: a preset whose estimator needs more than a batch's rewards and uids (CoDaPO's needs the old
    policy's log-probs, which the replay does not have: ``Method.estimator_needs``) or whose advantages another
    method's runtime changes (the replay runs the estimator alone), one whose loss aggregation has no per-token
    weight rule here (``WEIGHT_RULES``; CoDaPO's token-mean too), and one whose advantages and aggregation are an
    earlier preset's (AGPO's dual feedback is GRPO's on a batch: it acts on the sampling and the clip).
    """
    methods, seen = [], set()
    for preset in presets.presets():
        settings = preset.settings()
        replayed = (settings.advantages, settings.loss_agg_mode)
        if settings.needs is None and not settings.advantage_methods and settings.loss_agg_mode in WEIGHT_RULES \
                and replayed not in seen:
            seen.add(replayed)
            methods.append(Method(preset.title, settings.adv_estimator, settings.norm_adv_by_std_in_grpo,
                                  settings.loss_agg_mode))
    return tuple(methods)


_METHODS: Optional[tuple[Method, ...]] = None


def methods() -> tuple[Method, ...]:
    """``preset_methods()``, composed once per process on first use (not at import: the testbed imports this
    module for its statistics alone)."""
    global _METHODS
    if _METHODS is None:
        _METHODS = preset_methods()
    return _METHODS


def method_named(name: str) -> Method:
    for method in methods():
        if method.name == name:
            return method
    raise KeyError(f"unknown method {name!r}; known: {', '.join(m.name for m in methods())}")


def method_advantages(scores: Any, groups: Any, method: Method, apo: Optional[dict] = None,
                      scopes: Optional[Any] = None) -> np.ndarray:
    """A_i of one step's responses, as verl's ``compute_advantage`` returns them for ``method``.

    ``scores``: R_i per response; ``groups``: its prompt group (verl's uid); ``apo``: the ``algorithm.apo``
    settings. APO's anchor is the driver's (``recipe_apo.methods.apo.anchor``): calls in step order replay it, and
    ``reset_driver_anchors()`` starts a fresh one. ``scopes``: per-response data sources, for
    ``anchor_scope=data_source``.
    """
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import recipe_apo.plugin  # noqa: F401  (registers the recipe's estimators)
    from recipe_apo.methods.driver_state import handed

    rewards = torch.as_tensor(np.asarray(scores, dtype=np.float64), dtype=torch.float32).reshape(-1, 1)
    labels = np.asarray(groups, dtype=object)
    if rewards.shape[0] == 0:
        return np.zeros(0)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones_like(rewards)},
        non_tensors={"uid": labels},
    )
    algorithm = OmegaConf.create({
        "adv_estimator": method.adv_estimator, "norm_adv_by_std_in_grpo": method.norm_adv_by_std_in_grpo,
        "gamma": 1.0, "lam": 1.0, "apo": dict(apo or {}),
    })
    with handed(scopes=scopes):
        data = compute_advantage(data, adv_estimator=algorithm.adv_estimator,
                                 norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm)
    return data.batch["advantages"][:, 0].to(torch.float64).numpy()
