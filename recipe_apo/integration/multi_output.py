"""Multi-output trajectories: verl's final-output rule for the recipe's estimators (``apo``, ``codapo``).

An agent loop whose ``run()`` returns a list of outputs writes one TransferQueue row per output, under the key
``{uid}_{session}_{index}`` (verl 0.9.1 ``trainer/ppo/v1/agent_loop_tq.py:178-193``): ``uid`` is the prompt's,
``session`` one of its ``rollout.n`` trajectories, ``index`` the output's place in the list. verl scores the
last output and copies its reward to the others (``agent_loop_tq.py:160-175``). Its V1 advantage step,
``compute_advantage_for_multi_trajectories`` (``trainer/ppo/v1/utils.py:148-217``), then gives ``grpo`` one
outcome per trajectory: the final output (the largest index of its ``{uid}_{session}``) stands for the
trajectory in its group, and the advantage read at that row's first valid token is broadcast, times each
row's ``response_mask``, to every output of the trajectory. Every other estimator gets every output row as a
member of its group (``utils.py:167-175``), so a trajectory with three outputs would count three times in
APO's group success rate, its anchor's batch success and CoDaPO's accuracy.

The recipe's trainer gives ``apo`` and ``codapo`` the same rule as ``grpo``: for the duration of verl's own
advantage step, the trainer swaps (``verl_access.multi_trajectory_advantage_replaced``) the one name verl's trainer
looks up at call time (``trainer_base.compute_advantage_for_multi_trajectories``,
``trainer/ppo/v1/trainer_base.py:75,1775``) for ``final_output_advantage``, which calls verl's ``compute_advantage``
on the final rows and broadcasts as verl does (``final_output_rule`` gives it for a step). verl's KL-in-reward,
rollout correction and write-back around it run unchanged. A batch in which every trajectory has one output (verl's
``single_turn_agent`` and ``tool_agent`` loops) is left to verl's own function: the identity, bit for bit.

``Sessions`` is the one pass over a step's keys that everything else reads: the hooks hand the estimator the
final rows' data sources and old log-probs, broadcast its per-response values back to every row for the dump,
and the zero-variance rescale decides which groups are dead on the final rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from recipe_apo.errors import RecipeError
from recipe_apo.methods import catalog
from recipe_apo.methods.base import Trajectories

# The estimators routed through the final-output rule: every estimator a method of the recipe registers (verl
# applies the rule to ``grpo`` itself).
ROUTED_ESTIMATORS = frozenset(catalog.estimators())


class MultiOutputError(RecipeError, RuntimeError):
    """The final-output rule cannot be applied as it is meant to; the message says why."""


def _session_and_index(key: str) -> tuple[str, int]:
    """``({uid}_{session}, index)`` of a verl V1 row key; a key not of that form is a trajectory of its own.

    verl's GRPO rule asserts the form (``utils.py:181-183``); its rollout dump accepts any key and sorts one not
    of the form as ``(key, 0, 0)`` (``trainer_base.py:1318-1324``), and so does this rule.
    """
    parts = key.rsplit("_", 2)
    if len(parts) == 3 and parts[2].isdigit():
        return key[: -len(parts[2]) - 1], int(parts[2])
    return key, 0


@dataclass(frozen=True)
class Sessions(Trajectories):
    """The trajectories (``{uid}_{session}``) of one step's rows, in first-seen order, as verl numbers them.

    ``final_rows[s]`` is the row of trajectory s's final output (the largest index); ``row_trajectory[i]`` is the
    trajectory of row i. Padding rows (``pad<hex>_{i}_0``) are trajectories of one output each.
    """

    keys: Sequence[str] = ()

    @classmethod
    def of(cls, keys: Sequence[str]) -> "Sessions":
        """Parse ``keys`` once (one pass, as verl's own rule does) and find each trajectory's final row."""
        parsed = [_session_and_index(key) for key in keys]
        n = len(parsed)
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, keys)
        names = np.empty(n, dtype=object)
        names[:] = [name for name, _ in parsed]
        index = np.fromiter((i for _, i in parsed), dtype=np.int64, count=n)
        codes, uniques = pd.factorize(names)
        codes = codes.astype(np.int64, copy=False)
        if len(uniques) == n:  # one output per trajectory
            return cls(np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64), keys)
        # Rows sorted by (trajectory, index): each trajectory's last row in that order is its final output.
        order = np.lexsort((index, codes))
        last = np.ones(n, dtype=bool)
        last[:-1] = codes[order][1:] != codes[order][:-1]
        return cls(order[last], codes, keys)

    def metrics(self, tags: Sequence[dict] = ()) -> dict[str, float]:
        """``multi_output/*`` of a step whose trajectories have several outputs (none for single-output steps).

        ``tags``: the rows' TransferQueue tags (``batch.tags``); verl's padding rows, tagged ``is_padding``
        (``padding_utils.py:133-139``), are not counted.
        """
        if self.single_output:
            return {}
        real = np.ones(self.rows, dtype=bool)
        if len(tags) == self.rows:
            real = ~np.fromiter((bool(tag.get("is_padding", False)) for tag in tags), dtype=bool, count=self.rows)
        outputs = np.bincount(self.row_trajectory[real], minlength=self.count)
        outputs = outputs[outputs > 0]
        return {
            "multi_output/trajectories": float(outputs.size),
            "multi_output/outputs_per_trajectory_mean": float(outputs.mean()),
            "multi_output/outputs_per_trajectory_max": float(outputs.max()),
        }


def routes(adv_estimator: Any) -> bool:
    """Whether the recipe's trainer applies the final-output rule to this estimator (verl does it for grpo)."""
    return str(adv_estimator) in ROUTED_ESTIMATORS


def final_output_advantage(sessions: Sessions, data, batch_keys: Sequence[str], adv_estimator, gamma: float = 1.0,
                           lam: float = 1.0, num_repeat: int = 1, norm_adv_by_std_in_grpo: bool = True,
                           config: Any = None):
    """verl's ``compute_advantage_for_multi_trajectories`` for a routed estimator: verl's ``compute_advantage``
    on the final rows, and each trajectory's advantage (read at its final row's first valid token) times every
    row's ``response_mask``, as verl's GRPO branch writes it (``utils.py:198-217``)."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    if len(batch_keys) != sessions.rows or (batch_keys is not sessions.keys
                                            and list(batch_keys) != list(sessions.keys)):
        raise MultiOutputError(
            f"multi-output: verl's advantage step got {len(batch_keys)} rows, not the {sessions.rows} rows whose "
            "trajectories the recipe's trainer parsed"
        )
    final = compute_advantage(data.select_idxs(sessions.final_rows), adv_estimator=adv_estimator, gamma=gamma,
                              lam=lam, num_repeat=num_repeat, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                              config=config)
    first_valid = final.batch["response_mask"].argmax(dim=1)
    outcome = final.batch["advantages"][torch.arange(len(final)), first_valid]
    advantages = outcome[torch.from_numpy(sessions.row_trajectory).to(outcome.device)].unsqueeze(-1) \
        * data.batch["response_mask"]
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages
    return data


def final_output_rule(adv_estimator: Any, sessions: Sessions) -> Optional[Callable[..., Any]]:
    """What verl's V1 advantage step calls instead of its ``compute_advantage_for_multi_trajectories`` for this step
    (``verl_access.multi_trajectory_advantage_replaced``): the final-output rule for ``adv_estimator`` too; None
    (nothing changes) for an estimator verl handles itself (``grpo``'s rule, or every other estimator's every row)
    or for a step whose trajectories have one output each."""
    if not routes(adv_estimator) or sessions.single_output:
        return None

    def routed(data, batch_keys, adv_estimator, **kwargs):
        return final_output_advantage(sessions, data, batch_keys, adv_estimator, **kwargs)

    return routed
