"""recipe_apo.reward.truncation: truncated responses score 0 (``truncation=zero``), exact cases built by hand.

The manager runs here as verl's reward loop runs it: one single-row DataProto per call of ``run_single``, on
the manager's own event loop. The decode is a stand-in tokenizer (ids joined as text), the reward function
scores every response 1, so any 0 comes from the truncation rule.
"""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto

from recipe_apo.reward.truncation import TruncationAwareRewardManager, end_token_ids, generation_config_of, is_truncated

CAP = 4
EOS = 9
PAD = 0


class IdTokenizer:
    eos_token_id = EOS
    pad_token_id = PAD

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids if not (skip_special_tokens and int(i) == EOS))


def always_right(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 1.0


def batch(responses):
    """One row per response (ids without padding), right-padded to CAP as verl's agent loop pads them."""
    rows = len(responses)
    padded = torch.full((rows, CAP), PAD, dtype=torch.long)
    mask = torch.zeros((rows, CAP), dtype=torch.long)
    for row, ids in enumerate(responses):  # test set-up
        padded[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    prompts = torch.ones((rows, 2), dtype=torch.long)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": padded,
                 "attention_mask": torch.cat([torch.ones_like(prompts), mask], dim=1)},
        non_tensors={"data_source": np.array(["toy"] * rows, dtype=object),
                     "reward_model": np.array([{"ground_truth": "x"}] * rows, dtype=object)},
    )


def manager(model_path=None):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": CAP},
                                                     "model": {"path": model_path}},
                               "reward": {}})
    return TruncationAwareRewardManager(config, IdTokenizer(), always_right)


def scores(reward_manager, responses):
    data = batch(responses)
    return [reward_manager.loop.run_until_complete(reward_manager.run_single(data[i: i + 1]))
            for i in range(len(data))]


def test_a_response_cut_at_the_cap_scores_zero_and_one_that_ended_keeps_its_score():
    cut, ended_at_cap, short = scores(manager(), [[1, 2, 3, 4], [1, 2, 3, EOS], [1, 2]])
    assert cut["reward_score"] == 0.0
    assert cut["reward_extra_info"] == {"acc": 0.0, "score_before_truncation": 1.0, "truncated": 1.0}
    for kept in (ended_at_cap, short):
        assert kept["reward_score"] == 1.0
        assert kept["reward_extra_info"] == {"acc": 1.0, "score_before_truncation": 1.0, "truncated": 0.0}


def test_the_models_generation_config_eos_ids_end_a_response_too(tmp_path):
    from transformers import GenerationConfig

    GenerationConfig(eos_token_id=[7, EOS]).save_pretrained(tmp_path)
    assert end_token_ids(IdTokenizer(), generation_config_of(str(tmp_path))) == {7, EOS}
    assert end_token_ids(IdTokenizer(), generation_config_of(None)) == {EOS}
    (with_config,) = scores(manager(str(tmp_path)), [[1, 2, 3, 7]])
    (without,) = scores(manager(), [[1, 2, 3, 7]])
    assert with_config["reward_score"] == 1.0 and without["reward_score"] == 0.0


@pytest.mark.parametrize("ids, truncated", [([1, 2, 3, 4], True), ([1, 2, 3, EOS], False), ([1, 2, 3], False),
                                            ([EOS, 1, 2, 3], True)])
def test_is_truncated(ids, truncated):
    padded = torch.tensor(ids + [PAD] * (CAP - len(ids)))
    mask = torch.tensor([1] * len(ids) + [0] * (CAP - len(ids)))
    assert is_truncated(padded, mask, CAP, {EOS}) is truncated
