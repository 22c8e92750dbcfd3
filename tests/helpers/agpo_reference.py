"""AGPO's training rewards and advantages as its authors' pipeline reads (verl pull request #2649 at 4cbea10: their
data's scorer, ``verl/utils/reward_score/math_dapo.py``, which ``data_source: math_agpo`` selects; the reward
manager's length bonus, ``verl/workers/reward_manager/agpo.py``; ``compute_agpo_outcome_advantage``), re-written
here as per-response loops, float32 as in the source: the reference the recipe's vectorized estimator is checked
against (tests/methods/test_agpo.py, and on a rehearsal's dump tests/vllm/test_agpo.py)."""

from __future__ import annotations

from collections import defaultdict

import torch


def authors_shaped(rewards, lengths, uids, bonus=0.1):
    """The reward manager's length bonus as its code reads (reward == 1 is right; per group of a prompt)."""
    length_reward = [1] * len(rewards)
    groups = defaultdict(list)
    for i, uid in enumerate(uids):
        groups[uid].append(i)
    for group in groups.values():
        right = [i for i in group if rewards[i] == 1]
        if right:
            right_lengths = [lengths[i] for i in right]
            if len(right) < len(group) and max(right_lengths) != min(right_lengths):
                for i in right:
                    ratio = (lengths[i] - min(right_lengths)) / (max(right_lengths) - min(right_lengths))
                    length_reward[i] = 1 + bonus * (1 - ratio)
    return torch.tensor(rewards, dtype=torch.float32) * torch.tensor(length_reward)


def authors_advantages(scores, uids, norm=True, epsilon=1e-6):
    """``compute_agpo_outcome_advantage``'s loops, float32 as in the source."""
    scores = scores.clone()
    groups = defaultdict(list)
    for i, uid in enumerate(uids):
        groups[uid].append(scores[i])
    mean, std = {}, {}
    for uid, values in groups.items():
        if len(values) == 1:
            mean[uid], std[uid] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean[uid], std[uid] = torch.mean(torch.tensor(values)), torch.std(torch.tensor([values]))
    for i, uid in enumerate(uids):
        if mean[uid] == 1 and std[uid] == 0:
            scores[i] = 1.0
        elif mean[uid] == 0 and std[uid] == 0:
            scores[i] = -1.0
        elif norm:
            scores[i] = (scores[i] - mean[uid]) / (std[uid] + epsilon)
        else:
            scores[i] = scores[i] - mean[uid]
    return scores


def math_dapo_score(correct):
    """``math_dapo.compute_score``'s ``score`` for a verdict: ``1.0 if correct else -1.0``."""
    return 1.0 if correct else -1.0


def authors_pipeline(rewards, lengths, uids, norm=True):
    """(training rewards, advantages) of the authors' pipeline for a batch a 0/1 verifier scored (``rewards``):
    each verdict rescored as math_dapo scores it, the reward manager's bonus on those scores (its
    ``reward_tensor`` holds each score on the response's last token, so the estimator's row sum is the score),
    then their estimator, grouped by ``uids``."""
    scores = [math_dapo_score(reward == 1) for reward in rewards]
    shaped = authors_shaped(scores, lengths, uids)
    return shaped, authors_advantages(shaped, uids, norm)
