"""The anchor in verl's checkpoint folders: atomic save, resume in a new process, fallbacks, plain-verl callback."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import torch
from omegaconf import OmegaConf

from recipe_apo.anchor import driver_anchors, get_driver_anchor, reset_driver_anchor
from recipe_apo.checkpoint import STATE_FILE, AnchorCheckpointCallback, load_anchor_state, save_anchor_state

# One step of training as the driver sees it: a batch through the registered estimator, seeded by the step.
STEP_SCRIPT = """
import sys, json
import numpy as np, torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

def step(k, algorithm):
    gen = torch.Generator().manual_seed(k)
    n, width = 64, 7
    rewards = (torch.rand(n, generator=gen) < 0.1 + 0.8 * torch.rand(n // 8, generator=gen).repeat_interleave(8))
    token_rewards = torch.zeros(n, width)
    token_rewards[:, -1] = rewards.float()
    mask = torch.ones(n, width)
    uids = np.array([f"{k}-{i // 8}" for i in range(n)], dtype=object)
    adv, _ = get_adv_estimator_fn("apo")(token_level_rewards=token_rewards, response_mask=mask,
                                         config=algorithm, index=uids)
    return adv
"""


def trainer_config(tmp_path, resume_mode="auto", **apo):
    return OmegaConf.create({
        "algorithm": {"adv_estimator": "apo", "apo": {"history": 6, **apo}},
        "trainer": {"default_local_dir": str(tmp_path / "ckpt"), "resume_mode": resume_mode, "resume_from_path": None},
    })


def run_child(code, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    result = subprocess.run([sys.executable, "-c", STEP_SCRIPT + textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=180, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_resume_in_a_new_process_continues_bit_for_bit(tmp_path):
    config_path = tmp_path / "config.yaml"
    OmegaConf.save(trainer_config(tmp_path), config_path)
    # Uninterrupted run of 6 steps, saving at step 4 as verl's trainer does, in a process of its own.
    run_child(f"""
        from recipe_apo.checkpoint import save_anchor_state
        config = OmegaConf.load("{config_path}")
        outs = []
        for k in range(1, 7):
            outs.append(step(k, config.algorithm))
            if k == 4:
                save_anchor_state("{tmp_path}/ckpt/global_step_4", 4)
                open("{tmp_path}/ckpt/latest_checkpointed_iteration.txt", "w").write("4")
        torch.save(outs, "{tmp_path}/uninterrupted.pt")
    """, tmp_path)
    # A new process resumes from the latest checkpoint (resume_mode=auto) and runs steps 5 and 6.
    run_child(f"""
        from recipe_apo.checkpoint import restore_for_run
        config = OmegaConf.load("{config_path}")
        assert restore_for_run(config)
        torch.save([step(k, config.algorithm) for k in (5, 6)], "{tmp_path}/resumed.pt")
    """, tmp_path)
    uninterrupted = torch.load(tmp_path / "uninterrupted.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    assert torch.equal(resumed[0], uninterrupted[4]) and torch.equal(resumed[1], uninterrupted[5])
    # Without the anchor state the same steps differ: the test can tell a restored anchor from a fresh one.
    run_child(f"""
        config = OmegaConf.load("{config_path}")
        torch.save([step(k, config.algorithm) for k in (5, 6)], "{tmp_path}/fresh.pt")
    """, tmp_path)
    assert not torch.equal(torch.load(tmp_path / "fresh.pt")[0], uninterrupted[4])


def test_state_file_is_json_written_atomically_with_the_step(tmp_path):
    reset_driver_anchor()
    get_driver_anchor(init=0.4).update(0.6, eta=1.0, eta_min=0.5, history=20)
    path = save_anchor_state(str(tmp_path / "global_step_3"), 3)
    state = json.loads(open(path).read())
    assert state["global_step"] == 3 and state["anchors"]["global"]["value"] == 0.5
    assert os.listdir(tmp_path / "global_step_3") == [STATE_FILE]  # no temporary file left behind
    assert os.stat(path).st_mode & 0o777 == 0o644
    reset_driver_anchor()


def test_missing_and_corrupt_state_warn_and_fall_back_to_a_fresh_anchor(tmp_path, caplog):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    reset_driver_anchor()
    get_driver_anchor(init=0.9)
    with caplog.at_level(logging.WARNING, logger="recipe_apo"):
        assert load_anchor_state(str(folder)) is False
    assert "no apo_state.json" in caplog.text and "restarts fresh" in caplog.text
    assert get_driver_anchor().value is None  # the fresh anchor, not the one from before
    caplog.clear()
    for corrupt in ('{"version": 1, "anchors": {"global": {"value": "x"}}}', "{not json", ""):
        (folder / STATE_FILE).write_text(corrupt)
        with caplog.at_level(logging.WARNING, logger="recipe_apo"):
            assert load_anchor_state(str(folder)) is False
        assert f"cannot read {folder / STATE_FILE}" in caplog.text
        assert driver_anchors().anchors == {}
        caplog.clear()
    reset_driver_anchor()


def test_plain_verl_callback_restores_on_start_and_saves_on_each_checkpoint(tmp_path):
    callback = AnchorCheckpointCallback(trainer_config(tmp_path))  # nothing to resume: a fresh anchor
    assert get_driver_anchor().value is None
    get_driver_anchor().update(0.25, eta=1.0, eta_min=0.05, history=6)  # warm start at the first batch
    callback.on_save(trainer=None, global_step=2, checkpoint_dir=str(tmp_path / "ckpt" / "global_step_2"))
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    reset_driver_anchor()
    AnchorCheckpointCallback(trainer_config(tmp_path))  # what verl builds when the resumed trainer starts
    assert get_driver_anchor().value == 0.25
    AnchorCheckpointCallback(trainer_config(tmp_path, resume_mode="disable"))
    assert get_driver_anchor().value is None

    resume_path = trainer_config(tmp_path, resume_mode="resume_path")
    resume_path.trainer.resume_from_path = str(tmp_path / "ckpt" / "global_step_2")
    AnchorCheckpointCallback(resume_path)
    assert get_driver_anchor().value == 0.25
    reset_driver_anchor()


def test_callback_ignores_runs_of_other_estimators(tmp_path):
    config = trainer_config(tmp_path)
    config.algorithm.adv_estimator = "grpo"
    callback = AnchorCheckpointCallback(config)
    callback.on_save(trainer=None, global_step=1, checkpoint_dir=str(tmp_path / "global_step_1"))
    assert not (tmp_path / "global_step_1").exists()
