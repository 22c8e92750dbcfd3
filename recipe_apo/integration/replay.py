"""A method's advantages on a step's responses, as verl's ``compute_advantage`` returns them for one of the
recipe's presets: what the bias audit and the CPU testbed replay (``recipe_apo.methods.group_stats`` measures them).

The replay hands the estimator what the trainer did: each response's score on its last token and a response mask
as long as the response (AGPO's length bonus reads it; APO's estimator takes a response of no token for verl's
padding), its prompt group, and the preset's own composed ``algorithm`` node as the estimator's config, every
method's settings (``algorithm.apo``, ``algorithm.agpo``, ...) as the preset declares them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from recipe_apo.integration import presets
from recipe_apo.methods.errors import BatchInputError
from recipe_apo.methods.group_stats import WEIGHT_RULES

# The most cells (responses x the longest response's tokens) of the mask and rewards a replay lays out: 2^28, a
# step of 8192 responses of up to 32768 tokens, in about 1 GiB a float32 tensor (the replay holds a few at once).
MAX_MASK_CELLS = 2**28


@dataclass(frozen=True)
class Method:
    """One method's estimator and aggregation, as the recipe's presets (``conf/method/``) set them; ``name`` is
    the preset's title (``GRPO``, ``Dr. GRPO``, ``APO``)."""

    name: str
    adv_estimator: str
    norm_adv_by_std_in_grpo: bool
    loss_agg_mode: str
    # The preset's composed ``algorithm`` node, resolved and read-only: the config verl's trainer hands the
    # estimator (None: verl's defaults and the estimator's own). Not part of a method's identity.
    algorithm: Optional[DictConfig] = field(default=None, compare=False, repr=False)


def preset_methods() -> tuple[Method, ...]:
    """The methods the audit replays: the recipe's presets (``recipe_apo.integration.presets``), as the recipe
    composes them, in their order, that a replay from a step's scores, lengths and groups alone can run.

    Left out: a preset whose estimator needs more than a batch's rewards, response mask and uids (CoDaPO's needs
    the old policy's log-probs, which the replay does not have: ``Estimator.needs``) or whose advantages
    another method's runtime changes (the replay runs the estimator alone), one whose loss aggregation has no
    per-token weight rule here (``WEIGHT_RULES``; CoDaPO's token-mean too), and one whose advantages and
    aggregation are an earlier preset's (AGPO's dual feedback is GRPO's on a batch: it acts on the sampling and
    the clip).
    """
    methods, seen = [], set()
    for preset in presets.presets():
        config = presets.compose(preset.name)
        settings = presets.MethodSettings.of(config)
        replayed = (settings.advantages, settings.loss_agg_mode)
        if settings.needs is None and not settings.advantage_methods and settings.loss_agg_mode in WEIGHT_RULES \
                and replayed not in seen:
            seen.add(replayed)
            algorithm = OmegaConf.create(OmegaConf.to_container(config.algorithm, resolve=True))
            OmegaConf.set_readonly(algorithm, True)
            methods.append(Method(preset.title, settings.adv_estimator, settings.norm_adv_by_std_in_grpo,
                                  settings.loss_agg_mode, algorithm))
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


# The estimators' configs made so far, by (method, apo): a step's replay reuses them (making one from a preset's
# whole algorithm node takes about 10 ms). Each entry holds its method, so that no other object takes its id.
_CONFIGS: dict[tuple[int, str], tuple[Method, DictConfig]] = {}
_MAX_CONFIGS = 64


def _algorithm(method: Method, apo: Optional[dict]) -> DictConfig:
    """The estimator's config, read-only: the preset's ``algorithm`` node, with ``algorithm.apo`` replaced by
    ``apo`` when given (APO's defaults for the keys it leaves out)."""
    key = (id(method), json.dumps(apo, sort_keys=True, default=repr))
    if key not in _CONFIGS:
        node = {} if method.algorithm is None else OmegaConf.to_container(method.algorithm)
        node.update(adv_estimator=method.adv_estimator, norm_adv_by_std_in_grpo=method.norm_adv_by_std_in_grpo)
        if apo is not None:
            node["apo"] = dict(apo)
        config = OmegaConf.create(node)
        OmegaConf.set_readonly(config, True)
        if len(_CONFIGS) >= _MAX_CONFIGS:
            _CONFIGS.clear()
        _CONFIGS[key] = (method, config)
    return _CONFIGS[key][1]


def response_tensors(scores: Any, lengths: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_level_rewards, response_mask) of responses ``lengths`` tokens long, float32, (n, longest or 1):
    each mask row ones over its response's tokens, each score on its response's last token as verl's reward
    loop puts it (a response of no token: on its first column; the estimators read a row's sum)."""
    rewards = torch.as_tensor(np.asarray(scores, dtype=np.float64), dtype=torch.float32).reshape(-1)
    counts = np.asarray(lengths, dtype=np.float64).reshape(-1)
    n = rewards.shape[0]
    if counts.shape[0] != n:
        raise BatchInputError(f"replay: {counts.shape[0]} response lengths for {n} scores")
    bad = np.flatnonzero(~np.isfinite(counts) | (counts < 0) | (counts != np.floor(counts)))
    if bad.size:
        raise BatchInputError(f"replay: response {bad[0]}'s length {counts[bad[0]]!r} is not a whole number of "
                              f"tokens (nor are {bad.size - 1} more)")
    width = max(int(counts.max(initial=0.0)), 1)
    if n * width > MAX_MASK_CELLS:
        raise BatchInputError(f"replay: response {int(np.argmax(counts))} is {width} tokens long: a mask of {n} x "
                              f"{width} tokens, beyond the replay's {MAX_MASK_CELLS} cells")
    tokens = torch.from_numpy(counts.astype(np.int64))
    mask = (torch.arange(width).unsqueeze(0) < tokens.unsqueeze(1)).to(torch.float32)
    token_level_rewards = torch.zeros((n, width), dtype=torch.float32)
    token_level_rewards[torch.arange(n), (tokens - 1).clamp(min=0)] = rewards
    return token_level_rewards, mask


def method_advantages(scores: Any, groups: Any, method: Method, apo: Optional[dict] = None,
                      scopes: Optional[Any] = None, *, lengths: Any) -> np.ndarray:
    """A_i of one step's responses, as verl's ``compute_advantage`` returns them for ``method`` (each response's
    first token's; 0 for a response of no token, whose mask is all 0).

    ``scores``: R_i per response; ``groups``: its prompt group (verl's uid); ``lengths``: L_i, its tokens (the
    sum of its response mask, what the trainer's estimator read); ``apo``: the ``algorithm.apo`` settings, in
    place of the preset's (None: the preset's). APO's anchor is the driver's (``recipe_apo.methods.apo.anchor``):
    calls in step order replay it, and ``reset_driver_anchors()`` starts a fresh one. ``scopes``: per-response
    data sources, for ``anchor_scope=data_source``.
    """
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import recipe_apo.plugin  # noqa: F401  (registers the recipe's estimators)
    from recipe_apo.methods.driver_state import handed

    token_level_rewards, response_mask = response_tensors(scores, lengths)
    labels = np.asarray(groups, dtype=object)
    if token_level_rewards.shape[0] == 0:
        return np.zeros(0)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_level_rewards, "response_mask": response_mask},
        non_tensors={"uid": labels},
    )
    algorithm = _algorithm(method, apo)
    with handed(scopes=scopes):
        data = compute_advantage(data, adv_estimator=algorithm.adv_estimator, gamma=algorithm.get("gamma", 1.0),
                                 lam=algorithm.get("lam", 1.0),
                                 norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo, config=algorithm)
    return data.batch["advantages"][:, 0].to(torch.float64).numpy()
