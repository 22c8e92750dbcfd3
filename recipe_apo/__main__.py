"""``python -m recipe_apo``: check the plugin and show APO's advantages beside GRPO's and Dr. GRPO's.

Runs on CPU in seconds: it pushes one hand-made batch through verl's own ``compute_advantage`` with the
registered estimators, prints the methods side by side, and prints the verl command that trains with APO with
the recipe (training itself needs GPUs: verl's rollouts run on vLLM or SGLang). The methods are the recipe's
presets (``conf/method/``, ``recipe_apo.integration.presets``) whose estimator needs nothing but the batch's
rewards and prompt groups, one column per distinct set of advantages; the others are named with what they need
(CoDaPO: the old policy's log-probs) or whose advantages they repeat (AGPO's dual feedback: GRPO's).
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf

from recipe_apo.integration import presets
from recipe_apo.methods.apo import uses_apo
from recipe_apo.methods.apo.anchor import GLOBAL_SCOPE, driver_anchors, reset_driver_anchors

TRAIN_COMMAND = r"""python -m recipe_apo.main method=apo \
    data.train_files=$HOME/data/math/train.parquet data.val_files=$HOME/data/math/test.parquet \
    data.max_response_length=3000 data.train_batch_size=128 \
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    trainer.n_gpus_per_node=8 trainer.save_freq=50"""


def method_config(method: str):
    """The recipe's composed config for one method preset (conf/method/<method>.yaml), resolved."""
    config = presets.compose(method, ["algorithm.apo.anchor_init=0.5"])
    OmegaConf.resolve(config)
    return config


def demo_presets() -> tuple[dict, list[tuple[presets.Preset, str]]]:
    """({preset: its composed config} for the presets the demo batch runs, in order, one per distinct set of
    advantages; (preset, why not) for the others: what its estimator needs beyond the batch, or the earlier preset
    whose advantages it repeats)."""
    shown, skipped, seen = {}, [], {}
    for preset in presets.presets():
        config = method_config(preset.name)
        settings = presets.MethodSettings.of(config)
        if settings.needs is not None:
            skipped.append((preset, f"its estimator also needs {settings.needs}"))
        elif settings.advantages in seen:
            skipped.append((preset, f"the same advantages as {seen[settings.advantages]} (it differs in sampling "
                                    "or in the loss)"))
        else:
            seen[settings.advantages] = preset.title
            shown[preset] = config
    return shown, skipped


def example_batch():
    """Two prompts of four responses: one the model mostly fails, one it mostly solves."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    lengths = torch.tensor([40, 120, 95, 200, 30, 60, 45, 180])
    width = int(lengths.max())
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    token_rewards = torch.zeros(len(rewards), width)
    token_rewards[torch.arange(len(rewards)), lengths - 1] = rewards
    uids = np.array(["hard prompt"] * 4 + ["easy prompt"] * 4, dtype=object)
    return token_rewards, mask, uids, rewards


def advantages(algorithm, token_rewards, mask, uids) -> torch.Tensor:
    """One response-level advantage per row, through verl's own compute_advantage with a preset's settings."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask}, non_tensors={"uid": uids}
    )
    out = compute_advantage(
        data,
        adv_estimator=algorithm.adv_estimator,
        norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo,
        config=algorithm,
    )
    return out.batch["advantages"][:, 0]


def main() -> None:
    import verl

    import recipe_apo.plugin  # noqa: F401  (registers the recipe's estimators and losses)

    print(f"recipe-apo {recipe_apo.__version__} on verl {verl.__version__}: "
          "advantage estimator 'apo' and policy loss 'apo' are registered.\n")
    token_rewards, mask, uids, rewards = example_batch()
    shown, skipped = demo_presets()
    configs = {p.name: config for p, config in shown.items()}
    columns = {}
    anchor = None
    for method, config in configs.items():
        reset_driver_anchors()
        columns[method] = advantages(config.algorithm, token_rewards, mask, uids)
        if uses_apo(config):
            anchor = driver_anchors().anchor(GLOBAL_SCOPE).value
    reset_driver_anchors()

    print("Method presets (conf/method/), as the recipe composes them:")
    width = max(len(p.name) for p in (*shown, *(preset for preset, _ in skipped)))
    for method, config in configs.items():
        actor = config.actor_rollout_ref.actor
        print(f"  {method:<{width}} estimator {config.algorithm.adv_estimator}, std norm "
              f"{config.algorithm.norm_adv_by_std_in_grpo}, loss {actor.policy_loss.loss_mode}, "
              f"aggregation {actor.loss_agg_mode}")
    for preset, why in skipped:
        print(f"  {preset.name:<{width}} not on this batch: {why}")
    apo = next((c.algorithm.apo for c in configs.values() if uses_apo(c)), None)
    about_apo = "" if apo is None else f", APO anchor C_t = {anchor:.2f} (lambda_scale = {apo.lambda_scale})"
    print(f"\nOne batch, G = 4 responses per prompt, binary rewards{about_apo}.")
    print("Advantage of each response (the loss multiplies it into every token):\n")
    titles = {p.name: p.title for p in shown}
    widths = {name: max(8, len(title) + 1) for name, title in titles.items()}
    print(f"{'prompt':<12} {'reward':>6} {'tokens':>6} " + " ".join(f"{titles[m]:>{widths[m]}}" for m in columns))
    for i in range(len(rewards)):
        print(f"{uids[i]:<12} {rewards[i].item():>6.0f} {int(mask[i].sum()):>6d} "
              + " ".join(f"{columns[m][i].item():>{widths[m]}.3f}" for m in columns))
    print(
        "\nGRPO divides by the group's std, and its loss divides each response by its own length |o_i|.\n"
        "Dr. GRPO keeps R_i - mean(R). APO also boosts the rare success on the hard prompt and the rare\n"
        "failure on the easy one, and tempers the expected outcomes; its loss divides by a constant L0.\n"
        "AGPO gives the right answers of a mixed group a length bonus (the shortest 1.1, the longest 1.0).\n"
    )
    print("Train with APO on GPUs (set your model and data; see README for plain verl):\n")
    print(TRAIN_COMMAND)


if __name__ == "__main__":
    from recipe_apo.integration import quiet

    quiet.install()  # verl's warnings about the accelerators and engines a CPU has not (integration/quiet.py)
    main()
