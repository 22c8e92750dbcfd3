"""The anchor in verl's checkpoint folders: atomic save, resume in a new process, fallbacks, plain-verl callback."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from omegaconf import OmegaConf

from recipe_apo.integration.checkpoint import (
    STATE_FILE,
    AnchorCheckpointCallback,
    AnchorStateError,
    load_anchor_state,
    save_anchor_state,
)
from recipe_apo.methods.apo.settings import ApoSettings
from recipe_apo.methods.apo.anchor import driver_anchors, reset_driver_anchors

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
    # Uninterrupted run of 6 steps from a fresh anchor, saving at step 4 as verl's trainer does (in this process).
    namespace = {}
    exec(STEP_SCRIPT, namespace)
    config = OmegaConf.load(config_path)
    reset_driver_anchors()
    uninterrupted = []
    for k in range(1, 7):
        uninterrupted.append(namespace["step"](k, config.algorithm))
        if k == 4:
            save_anchor_state(str(tmp_path / "ckpt" / "global_step_4"), 4)
            (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("4")
    reset_driver_anchors()
    # A new process runs steps 5 and 6 twice: from a fresh anchor (what a run without the state would do), then,
    # the anchor reset, resumed from the latest checkpoint (resume_mode=auto).
    run_child(f"""
        from recipe_apo.integration.checkpoint import restore_for_run
        from recipe_apo.methods.apo.anchor import reset_driver_anchors
        config = OmegaConf.load("{config_path}")
        torch.save([step(k, config.algorithm) for k in (5, 6)], "{tmp_path}/fresh.pt")
        reset_driver_anchors()
        assert restore_for_run(config)
        torch.save([step(k, config.algorithm) for k in (5, 6)], "{tmp_path}/resumed.pt")
    """, tmp_path)
    resumed = torch.load(tmp_path / "resumed.pt")
    assert torch.equal(resumed[0], uninterrupted[4]) and torch.equal(resumed[1], uninterrupted[5])
    # Without the anchor state the same steps differ: the test can tell a restored anchor from a fresh one.
    assert not torch.equal(torch.load(tmp_path / "fresh.pt")[0], uninterrupted[4])


def test_state_file_is_json_written_atomically_with_the_step(tmp_path):
    reset_driver_anchors()
    driver_anchors(init=0.4).anchor().update(0.6, eta=1.0, eta_min=0.5, history=20)
    path = save_anchor_state(str(tmp_path / "global_step_3"), 3)
    state = json.loads(open(path).read())
    assert state["global_step"] == 3 and state["anchors"]["global"]["value"] == 0.5
    assert os.listdir(tmp_path / "global_step_3") == [STATE_FILE]  # no temporary file left behind
    assert os.stat(path).st_mode & 0o777 == 0o644
    reset_driver_anchors()


GOOD_ANCHOR = {"version": 1, "value": 0.5, "history": [0.4, 0.5], "history_len": 6, "steps": 2}


def state_text(**anchor_fields) -> str:
    return json.dumps({"global_step": 9, "version": 1, "anchors": {"global": {**GOOD_ANCHOR, **anchor_fields}}})


BROKEN_STATES = {
    # A file that is not what the recipe writes: each must stop the resume, none may be coerced.
    "missing": None,
    "empty": "",
    "not json": "{not json",
    "value is a string": state_text(value="x"),
    "value is true": state_text(value=True),
    "value out of range": state_text(value=1.5),
    "version as a string": json.dumps({"version": "1", "anchors": {}}),
    "version 1.9": json.dumps({"version": 1.9, "anchors": {}}),
    "anchor version true": state_text(version=True),
    "steps 2.7": state_text(steps=2.7),
    "steps true": state_text(steps=True),
    "history_len 1e20": state_text(history_len=1e20),
    "history_len 10**20": state_text(history_len=10**20),
    "history not a list": state_text(history="0.5"),
    "anchors a list": json.dumps({"version": 1, "anchors": []}),
    "deeply nested": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("case", list(BROKEN_STATES))
def test_a_broken_state_file_stops_the_resume_naming_the_file_and_leaves_the_anchor(tmp_path, case):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    if BROKEN_STATES[case] is not None:
        (folder / STATE_FILE).write_text(BROKEN_STATES[case])
    reset_driver_anchors()
    driver_anchors(init=0.9).anchor()
    with pytest.raises(AnchorStateError) as info:
        load_anchor_state(str(folder), ApoSettings(history=6))
    message = str(info.value)
    assert message.startswith(f"cannot resume the APO anchor from {folder / STATE_FILE}: ")
    assert "algorithm.apo.on_missing_state=fresh" in message and "\n" not in message
    assert driver_anchors().anchor().value == 0.9  # nothing was replaced
    reset_driver_anchors()


@pytest.mark.parametrize("saved_scopes, run_scope", [(["math", "code"], "global"), (["global"], "data_source")])
def test_a_state_of_the_other_anchor_scope_is_refused(tmp_path, saved_scopes, run_scope):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    (folder / STATE_FILE).write_text(json.dumps({"global_step": 9, "version": 1,
                                                 "anchors": {s: GOOD_ANCHOR for s in saved_scopes}}))
    with pytest.raises(AnchorStateError, match=f"this run has algorithm.apo.anchor_scope={run_scope}"):
        load_anchor_state(str(folder), ApoSettings(anchor_scope=run_scope))
    reset_driver_anchors()


def test_on_missing_state_fresh_warns_and_starts_a_fresh_anchor(tmp_path, caplog):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    reset_driver_anchors()
    driver_anchors(init=0.9).anchor()
    for content in (None, "{not json", state_text(steps=2.7)):
        if content is not None:
            (folder / STATE_FILE).write_text(content)
        with caplog.at_level(logging.WARNING, logger="recipe_apo"):
            assert load_anchor_state(str(folder), ApoSettings(on_missing_state="fresh", anchor_init=0.2)) is False
        assert "restarts fresh" in caplog.text and str(folder / STATE_FILE) in caplog.text
        assert driver_anchors().anchor().value == 0.2 and driver_anchors().anchor().steps == 0
        caplog.clear()
    reset_driver_anchors()


def test_a_good_state_file_is_restored_exactly(tmp_path):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    (folder / STATE_FILE).write_text(state_text())
    assert load_anchor_state(str(folder), ApoSettings(history=6)) is True
    assert driver_anchors().anchor().state_dict() == GOOD_ANCHOR
    reset_driver_anchors()


def test_plain_verl_callback_restores_on_start_and_saves_on_each_checkpoint(tmp_path):
    callback = AnchorCheckpointCallback(trainer_config(tmp_path))  # nothing to resume: a fresh anchor
    assert driver_anchors().anchor().value is None
    driver_anchors().anchor().update(0.25, eta=1.0, eta_min=0.05, history=6)  # warm start at the first batch
    callback.on_save(trainer=None, global_step=2, checkpoint_dir=str(tmp_path / "ckpt" / "global_step_2"))
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    reset_driver_anchors()
    AnchorCheckpointCallback(trainer_config(tmp_path))  # what verl builds when the resumed trainer starts
    assert driver_anchors().anchor().value == 0.25
    AnchorCheckpointCallback(trainer_config(tmp_path, resume_mode="disable"))
    assert driver_anchors().anchor().value is None

    resume_path = trainer_config(tmp_path, resume_mode="resume_path")
    resume_path.trainer.resume_from_path = str(tmp_path / "ckpt" / "global_step_2")
    AnchorCheckpointCallback(resume_path)
    assert driver_anchors().anchor().value == 0.25
    reset_driver_anchors()


def test_callback_ignores_runs_of_other_estimators(tmp_path):
    config = trainer_config(tmp_path)
    config.algorithm.adv_estimator = "grpo"
    callback = AnchorCheckpointCallback(config)
    callback.on_save(trainer=None, global_step=1, checkpoint_dir=str(tmp_path / "global_step_1"))
    assert not (tmp_path / "global_step_1").exists()
