"""The methods' runtime state in verl's checkpoint folders: the one codec (atomic JSON, checked reader, no pickle),
APO's anchor (resume in a new process bit for bit, fallbacks, the plain-verl callback), AGPO's controllers and
CoDaPO's kept prompts."""

import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from recipe_apo.integration import verl_access
from recipe_apo.integration.checkpoint import AnchorCheckpointCallback, restore_state, save_state
from recipe_apo.methods import catalog, handoff
from recipe_apo.methods.agpo_dual.controllers import AgpoDualState
from recipe_apo.methods.agpo_dual.runtime import AgpoDualStateError
from recipe_apo.methods.apo.anchor import driver_anchors, reset_driver_anchors
from recipe_apo.methods.apo.runtime import AnchorStateError
from recipe_apo.methods.codapo.runtime import ResamplingStateError
from recipe_apo.methods.errors import MethodStateError
from recipe_apo.methods.state_codec import StateFileError, read_state, write_state

APO_FILE, AGPO_FILE, CODAPO_FILE = "apo_state.json", "agpo_dual_state.json", "codapo_state.json"


def runtime(method: str, **algorithm):
    """A fresh runtime of ``method`` for a config of ``algorithm`` settings (verl's node, the estimator set), its
    estimator's state kept in the driver as an adapter starts a run (APO's anchors: ``driver_anchors()``)."""
    estimator = {"apo": "apo", "codapo": "codapo"}.get(method, "grpo")
    config = OmegaConf.create({"algorithm": {"adv_estimator": estimator, **algorithm},
                               "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "agpo_clip"}},
                                                     "rollout": {"temperature": 1.0}}})
    built = catalog.method(method).build_runtime(config)
    handoff.keep_estimator_states([built])
    return built


# ---- the codec ------------------------------------------------------------------------------------------------------
def test_a_state_round_trips_with_its_arrays_written_atomically(tmp_path):
    ragged = np.empty(2, dtype=object)
    ragged[:] = [{"role": "user", "content": "q"}], [{"role": "user", "content": "r"}]
    state = {"value": 0.1 + 0.2, "ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
             "half": torch.tensor([0.5, -1.25], dtype=torch.bfloat16), "flags": torch.tensor([True, False]),
             "numbers": np.array([1.5, 2.5]), "chats": ragged, "none": None}
    path = write_state(str(tmp_path / "global_step_3"), "x_state.json", "x", 3, state)
    assert os.listdir(tmp_path / "global_step_3") == ["x_state.json"]  # no temporary file left behind
    assert os.stat(path).st_mode & 0o777 == 0o644
    back, step = read_state(path, "x")
    assert step == 3 and back["value"] == 0.1 + 0.2 and back["none"] is None
    assert torch.equal(back["ids"], state["ids"]) and back["ids"].dtype == torch.int64
    assert back["half"].dtype == torch.bfloat16 and torch.equal(back["half"], state["half"])
    assert torch.equal(back["flags"], state["flags"]) and torch.equal(back["numbers"], torch.tensor([1.5, 2.5]))
    assert back["chats"] == [[{"role": "user", "content": "q"}], [{"role": "user", "content": "r"}]]


@pytest.mark.parametrize("text, cause", [
    (None, "it is missing"),
    ("{not json", "it cannot be read (JSONDecodeError"),
    ('{"kind": "x", "v": NaN}', "it cannot be read (ValueError: NaN is not a number a state holds)"),
    ('{"kind": "x", "v": 1e400}', "it cannot be read (ValueError: 1e400 is not a number a state holds (beyond"),
    ("[" * 100_000 + "]" * 100_000, "it cannot be read (RecursionError"),
    ('{"kind": "y"}', "it is not x's state (kind 'y')"),
    ("[1, 2]", "it cannot be read (a JSON list, not a mapping)"),
    ('{"kind": "x", "a": {"__array__": "int64", "shape": [2], "data": [1]}}', "an array of shape [2] holds 1 values"),
    ('{"kind": "x", "a": {"__array__": "object", "shape": [1], "data": [1]}}', "an array entry is malformed"),
    ('{"kind": "x", "a": {"__array__": "int64", "shape": [1], "data": [1.5]}}', "not whole numbers"),
])
def test_a_file_that_is_not_a_state_is_refused_in_one_line(tmp_path, text, cause):
    path = tmp_path / "x_state.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(StateFileError) as info:
        read_state(str(path), "x")
    assert cause in str(info.value) and "\n" not in str(info.value)


def test_nothing_is_read_back_through_pickle(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "x_state.json"
    path.write_bytes(pickle.dumps({"kept": Payload()}))
    with pytest.raises(StateFileError, match="it cannot be read"):
        read_state(str(path), "x")
    assert not marker.exists()


def test_a_file_without_a_kind_is_the_expected_methods_own():
    """APO's anchor files were written before the kinds: they read as APO's."""
    assert read_state.__doc__  # the codec says it
    # Kinds are checked when present (the cases above); absent, the file is taken as asked.


# ---- APO's anchor ---------------------------------------------------------------------------------------------------
# One step of training as the driver sees it: a batch through the registered estimator, seeded by the step.
STEP_SCRIPT = """
import sys, json
import numpy as np, torch
from omegaconf import OmegaConf
import recipe_apo.plugin
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


@pytest.mark.fresh_process
def test_resume_in_a_new_process_continues_bit_for_bit(tmp_path):
    config_path = tmp_path / "config.yaml"
    OmegaConf.save(trainer_config(tmp_path), config_path)
    # Uninterrupted run of 6 steps from a fresh anchor, saving at step 4 as the recipe's trainer does.
    namespace = {}
    exec(STEP_SCRIPT, namespace)
    config = OmegaConf.load(config_path)
    apo = catalog.method("apo").build_runtime(config)
    handoff.keep_estimator_states([apo])  # the estimator moves the runtime's anchors, as in the recipe's trainer
    uninterrupted = []
    for k in range(1, 7):
        uninterrupted.append(namespace["step"](k, config.algorithm))
        if k == 4:
            save_state(apo, str(tmp_path / "ckpt" / "global_step_4"), 4)
            (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("4")
    reset_driver_anchors()
    # A new process runs steps 5 and 6 twice: from a fresh anchor (what a run without the state would do), then
    # resumed from the latest checkpoint, as plain verl's callback finds it (resume_mode=auto).
    run_child(f"""
        from recipe_apo.integration.checkpoint import AnchorCheckpointCallback
        from recipe_apo.methods.apo.anchor import reset_driver_anchors
        config = OmegaConf.load("{config_path}")
        torch.save([step(k, config.algorithm) for k in (5, 6)], "{tmp_path}/fresh.pt")
        reset_driver_anchors()
        AnchorCheckpointCallback(config)
        torch.save([step(k, config.algorithm) for k in (5, 6)], "{tmp_path}/resumed.pt")
    """, tmp_path)
    resumed = torch.load(tmp_path / "resumed.pt")
    assert torch.equal(resumed[0], uninterrupted[4]) and torch.equal(resumed[1], uninterrupted[5])
    # Without the anchor state the same steps differ: the test can tell a restored anchor from a fresh one.
    assert not torch.equal(torch.load(tmp_path / "fresh.pt")[0], uninterrupted[4])


def test_the_anchor_file_is_json_with_the_step(tmp_path):
    apo = runtime("apo", apo={"anchor_init": 0.4})
    driver_anchors().anchor().update(0.6, eta=1.0, eta_min=0.5, history=20)
    path = save_state(apo, str(tmp_path / "global_step_3"), 3)
    state = json.loads(open(path).read())
    assert state["kind"] == "apo" and state["global_step"] == 3 and state["anchors"]["global"]["value"] == 0.5
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
    "another method's": json.dumps({"kind": "agpo_dual", "uncertainty_avg": 0.0}),
}


@pytest.mark.parametrize("case", list(BROKEN_STATES))
def test_a_broken_anchor_file_stops_the_resume_naming_the_file_and_leaves_the_anchor(tmp_path, case):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    if BROKEN_STATES[case] is not None:
        (folder / APO_FILE).write_text(BROKEN_STATES[case])
    apo = runtime("apo", apo={"anchor_init": 0.9, "history": 6})
    driver_anchors().anchor()
    with pytest.raises(AnchorStateError) as info:
        restore_state(apo, str(folder), 9)
    message = str(info.value)
    assert message.startswith(f"cannot resume the APO anchor from {folder / APO_FILE}: ")
    assert "algorithm.apo.on_missing_state=fresh" in message and "\n" not in message
    assert driver_anchors().anchor().value == 0.9  # nothing was replaced
    reset_driver_anchors()


@pytest.mark.parametrize("saved_scopes, run_scope", [(["math", "code"], "global"), (["global"], "data_source")])
def test_an_anchor_file_of_the_other_scope_is_refused(tmp_path, saved_scopes, run_scope):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    (folder / APO_FILE).write_text(json.dumps({"global_step": 9, "version": 1,
                                               "anchors": {s: GOOD_ANCHOR for s in saved_scopes}}))
    with pytest.raises(AnchorStateError, match=f"this run has algorithm.apo.anchor_scope={run_scope}"):
        restore_state(runtime("apo", apo={"anchor_scope": run_scope}), str(folder), 9)
    reset_driver_anchors()


def test_on_missing_state_fresh_warns_and_starts_a_fresh_anchor(tmp_path, caplog):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    for content in (None, "{not json", state_text(steps=2.7)):
        if content is not None:
            (folder / APO_FILE).write_text(content)
        apo = runtime("apo", apo={"on_missing_state": "fresh", "anchor_init": 0.2})
        driver_anchors().anchor().update(0.9, eta=1.0, eta_min=1.0, history=20)
        with caplog.at_level(logging.WARNING, logger="recipe_apo"):
            assert restore_state(apo, str(folder), 9) is False
        assert "restarts fresh" in caplog.text and str(folder / APO_FILE) in caplog.text
        assert driver_anchors().anchor().value == 0.2 and driver_anchors().anchor().steps == 0
        caplog.clear()
    reset_driver_anchors()


def test_a_good_anchor_file_is_restored_exactly(tmp_path):
    folder = tmp_path / "global_step_9"
    folder.mkdir()
    (folder / APO_FILE).write_text(state_text())  # written before the kinds: read as APO's
    assert restore_state(runtime("apo", apo={"history": 6}), str(folder), 9) is True
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


# ---- AGPO's controllers ---------------------------------------------------------------------------------------------
def agpo_runtime():
    return runtime("agpo_dual")


def test_the_controllers_round_trip_bit_for_bit(tmp_path):
    agpo = agpo_runtime()
    agpo.state = AgpoDualState(uncertainty_avg=0.1 + 0.2, entropy_ref=1 / 3, kl_avg=float(np.nextafter(0.02, 1.0)))
    path = save_state(agpo, str(tmp_path), 7)
    assert json.loads(open(path).read())["global_step"] == 7
    restored = agpo_runtime()
    assert restore_state(restored, str(tmp_path), 7)
    assert restored.state.state_dict() == agpo.state.state_dict()


@pytest.mark.parametrize("content, cause", [
    (None, "it is missing"),
    ("{", "it cannot be read (JSONDecodeError"),
    (json.dumps({"kind": "apo", "global_step": 3, "anchors": {}}), "it is not agpo_dual's state (kind 'apo')"),
    (json.dumps({"kind": "agpo_dual", "global_step": 3, "uncertainty_avg": 1.0}),
     "it cannot be read (MethodStateError: AGPO state must hold exactly"),
    (json.dumps({"kind": "agpo_dual", "uncertainty_avg": 1.0, "entropy_ref": 1.0, "kl_avg": 1e400}),
     "it cannot be read (ValueError: Infinity is not a number a state holds)"),
])
def test_a_missing_or_foreign_controller_file_stops_the_resume_in_one_line(tmp_path, content, cause):
    if content is not None:
        (tmp_path / AGPO_FILE).write_text(content)
    agpo = agpo_runtime()
    with pytest.raises(AgpoDualStateError) as info:
        restore_state(agpo, str(tmp_path), 3)
    message = str(info.value)
    assert message.startswith(f"cannot resume AGPO's controllers from {tmp_path / AGPO_FILE}: ")
    assert cause in message and "\n" not in message
    assert isinstance(info.value, MethodStateError)
    assert agpo.state.state_dict() == AgpoDualState().state_dict()


def test_a_fresh_start_reads_no_controller_file(tmp_path):
    assert restore_state(agpo_runtime(), str(tmp_path), 0) is False


# agpo_dual's state file while it had AGPO's name, as such a checkpoint holds it.
OLD_AGPO_FILE = "agpo_state.json"
OLD_STATE = {"kind": "agpo_dual", "global_step": 7, "uncertainty_avg": 0.25, "entropy_ref": 1.5, "kl_avg": 0.125}


def test_a_checkpoint_of_the_old_file_name_resumes_and_says_so_in_one_line(tmp_path, caplog):
    folder = tmp_path / "global_step_7"
    folder.mkdir()
    (folder / OLD_AGPO_FILE).write_text(json.dumps(OLD_STATE))
    agpo = agpo_runtime()
    with caplog.at_level(logging.INFO, logger="recipe_apo"):
        assert restore_state(agpo, str(folder), 7) is True
    assert agpo.state.state_dict() == {"uncertainty_avg": 0.25, "entropy_ref": 1.5, "kl_avg": 0.125}
    assert [record.getMessage() for record in caplog.records] == [
        f"recipe-apo: restored AGPO (dual)'s state from {folder / OLD_AGPO_FILE}, its file's old name (the recipe "
        "now writes agpo_dual_state.json)"]
    # the next checkpoint has the new name only
    assert save_state(agpo, str(tmp_path / "global_step_8"), 8) == str(tmp_path / "global_step_8" / AGPO_FILE)
    assert os.listdir(tmp_path / "global_step_8") == [AGPO_FILE]


def test_the_new_file_name_is_read_before_the_old_one_and_without_a_line(tmp_path, caplog):
    (tmp_path / OLD_AGPO_FILE).write_text(json.dumps(OLD_STATE))
    (tmp_path / AGPO_FILE).write_text(json.dumps({**OLD_STATE, "kl_avg": 0.5}))
    agpo = agpo_runtime()
    with caplog.at_level(logging.INFO, logger="recipe_apo"):
        assert restore_state(agpo, str(tmp_path), 7) is True
    assert agpo.state.kl_avg == 0.5 and caplog.records == []


def test_an_unreadable_file_of_the_old_name_stops_the_resume_naming_it(tmp_path):
    (tmp_path / OLD_AGPO_FILE).write_text(json.dumps({**OLD_STATE, "kind": "agpo"}))
    with pytest.raises(AgpoDualStateError) as info:
        restore_state(agpo_runtime(), str(tmp_path), 7)
    assert str(info.value) == (f"cannot resume AGPO's controllers from {tmp_path / OLD_AGPO_FILE}: it is not "
                               "agpo_dual's state (kind 'agpo')")


# ---- CoDaPO's kept prompts ------------------------------------------------------------------------------------------
def loader_batch(n: int):
    """A dataloader batch as verl's V1 trainer builds it (tu.get_tensordict of the collated rows plus uids)."""
    from verl.utils import tensordict_utils as tu

    raw_prompt = np.empty(n, dtype=object)  # one chat (a list of messages) per row
    raw_prompt[:] = [[{"role": "user", "content": f"q{i}"}] for i in range(n)]
    rows = {
        "raw_prompt": raw_prompt,
        "data_source": np.array([f"src{i % 2}" for i in range(n)], dtype=object),
        "reward_model": np.array([{"ground_truth": str(i)} for i in range(n)], dtype=object),
        "input_ids": torch.arange(3 * n).reshape(n, 3),
        "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
    }
    return tu.get_tensordict(rows)


def odd_step(codapo, step: int, batch, uids, weights) -> None:
    """A first step of a pair as the trainer runs it: drawn, weighted (its advantage steps), ended (selected)."""
    codapo.begin_step(step)
    assert codapo.replace_prompts(step, len(batch)) is None  # an odd step reads the dataloader
    codapo.drew_prompts(step, verl_access.prompts_of(batch), host=None)
    codapo.pairing.add_weights(np.array(uids, dtype=object), np.array(weights))
    codapo.end_step(step)


def test_the_even_step_is_built_from_the_kept_prompts_and_survives_a_checkpoint(tmp_path):
    codapo = runtime("codapo")
    # Weights per response (2 per prompt); prompts u1 and u3 reach the 0.75 quantile of [0.1, 0.8, 0.1, 0.8].
    odd_step(codapo, 3, loader_batch(4), ["u0", "u0", "u1", "u1", "u2", "u2", "u3", "u3"],
             [0.1, 0.1, 0.8, 0.8, 0.1, 0.1, 0.8, 0.8])
    assert save_state(codapo, str(tmp_path), 3).endswith(CODAPO_FILE)
    restored = runtime("codapo")
    assert restore_state(restored, str(tmp_path), 3)
    for each in (codapo, restored):
        each.begin_step(4)
        batch = verl_access.prompt_batch(each.replace_prompts(4, 8), 4)
        assert [p[0]["content"] for p in batch["raw_prompt"]] == ["q1"] * 4 + ["q3"] * 4
        assert list(batch["data_source"]) == ["src1"] * 8
        assert [r["ground_truth"] for r in batch["reward_model"]] == ["1"] * 4 + ["3"] * 4
        assert batch["input_ids"][:, 0].tolist() == [3] * 4 + [9] * 4
        assert len(set(batch["uid"])) == 8 and not set(batch["uid"]) & {"u0", "u1", "u2", "u3"}
        assert batch["global_steps"] == 4
    assert save_state(codapo, str(tmp_path / "even"), 4) is None  # nothing to keep after an even step


def test_a_pair_refuses_a_missing_state_or_the_wrong_step(tmp_path):
    codapo = runtime("codapo")
    with pytest.raises(ResamplingStateError, match=f"{CODAPO_FILE}: it is missing: step 5 is the first"):
        restore_state(codapo, str(tmp_path), 5)
    assert restore_state(codapo, str(tmp_path), 6) is False  # an even step's checkpoint needs nothing
    codapo.begin_step(5)
    codapo.drew_prompts(5, verl_access.prompts_of(loader_batch(2)), host=None)
    with pytest.raises(ResamplingStateError, match="no weighted step"):
        codapo.end_step(5)
    codapo.pairing.add_weights(np.array(["u0", "u1"], dtype=object), np.array([0.2, 0.3]))
    codapo.end_step(5)
    with pytest.raises(ResamplingStateError, match="step 8 needs the prompts kept at step 7"):
        codapo.replace_prompts(8, 2)
    save_state(codapo, str(tmp_path), 5)
    with pytest.raises(ResamplingStateError, match="it is not the kept prompts of step 7"):
        restore_state(runtime("codapo"), str(tmp_path), 7)


def test_kept_prompts_of_the_old_pickle_format_are_refused_with_the_way_out(tmp_path):
    torch.save({"version": 1, "step": 5, "kept": ["q"]}, tmp_path / "codapo_state.pt")
    with pytest.raises(ResamplingStateError) as info:
        restore_state(runtime("codapo"), str(tmp_path), 5)
    message = str(info.value)
    assert "old pickle format" in message and "algorithm.codapo.resample=false" in message and "\n" not in message


@pytest.mark.parametrize("content", [
    "\x00\x01garbage\n\nmore",
    json.dumps({"kind": "codapo", "global_step": 5, "step": 5, "kept": ["q1", "q2"]}),
    json.dumps({"kind": "codapo", "global_step": 5, "step": 5, "kept": {}}),
    json.dumps({"kind": "codapo", "global_step": 5, "step": 5, "kept": {"a": [1, 2], "b": [1]}}),
    json.dumps([1, 2, 3]),
])
def test_a_broken_kept_prompts_file_stops_the_resume_naming_the_file_and_the_way_out(tmp_path, content):
    (tmp_path / CODAPO_FILE).write_text(content)
    fresh = runtime("codapo")
    with pytest.raises(ResamplingStateError) as info:
        restore_state(fresh, str(tmp_path), 5)
    message = str(info.value)
    assert message.startswith(f"cannot resume CoDaPO's kept prompts from {tmp_path / CODAPO_FILE}")
    assert "algorithm.codapo.resample=false" in message and "\n" not in message
    assert fresh.kept is None and fresh.pairing.kept_step is None  # nothing restored


# ---- state files that are not what the recipe writes (issue 51, item 1) ---------------------------------------------
# Each method's state file, a valid one, and the runtime that reads it at a step whose checkpoint needs it.
def _codapo_state(**fields):
    return {"kind": "codapo", "global_step": 5, "step": 5, "kept": {"q": ["a", "b"]}, **fields}


VALID = {
    "apo": (APO_FILE, 9, lambda **f: {"kind": "apo", "global_step": 9, "version": 1,
                                       "anchors": {"global": {**GOOD_ANCHOR, **f}}}),
    "agpo_dual": (AGPO_FILE, 3, lambda **f: {"kind": "agpo_dual", "global_step": 3, "uncertainty_avg": 0.5,
                                             "entropy_ref": 1.5, "kl_avg": 0.01, **f}),
    "codapo": (CODAPO_FILE, 5, _codapo_state),
}
# How each runtime's refusal begins (the file named after it).
REFUSAL = {"apo": "cannot resume the APO anchor from", "agpo_dual": "cannot resume AGPO's controllers from",
           "codapo": "cannot resume CoDaPO's kept prompts from"}


def _runtime(method: str):
    return runtime(method, apo={"history": 6}) if method == "apo" else runtime(method)


def _refused(method: str, folder, step: int, within_s: float = 10.0) -> str:
    """The runtime's one-line refusal of ``folder``'s state file, which must come within ``within_s`` seconds (a
    read that blocks would never return: it runs in a thread the test gives up on)."""
    import threading
    import time

    fresh, outcome = _runtime(method), {}

    def restore():
        try:
            restore_state(fresh, str(folder), step)
        except MethodStateError as exc:
            outcome["error"] = exc

    started = time.monotonic()
    worker = threading.Thread(target=restore, daemon=True)
    worker.start()
    worker.join(within_s)
    assert not worker.is_alive(), f"restoring {method}'s state blocked for {within_s} s"
    assert time.monotonic() - started < within_s
    message = str(outcome["error"])
    path = folder / VALID[method][0]
    assert message.startswith(f"{REFUSAL[method]} {path}: ") and "\n" not in message, message
    if method == "apo":
        assert driver_anchors().anchor().value is None  # nothing installed
        reset_driver_anchors()
    if method == "agpo_dual":
        assert fresh.state.state_dict() == AgpoDualState().state_dict()
    if method == "codapo":
        assert fresh.kept is None and fresh.pairing.kept_step is None
    return message


def _write(folder, method: str, payload) -> None:
    name = VALID[method][0]
    (folder / name).write_text(payload if isinstance(payload, str) else json.dumps(payload))


@pytest.mark.parametrize("method", list(VALID))
def test_each_valid_state_file_is_restored_through_a_link_too(tmp_path, method):
    """The cases below refuse what the recipe did not write; the same file, as written, restores (also through a
    symbolic link to it: a link to a regular file is a regular file)."""
    name, step, valid = VALID[method]
    (tmp_path / "elsewhere.json").write_text(json.dumps(valid()))
    folder = tmp_path / f"global_step_{step}"
    folder.mkdir()
    os.symlink(tmp_path / "elsewhere.json", folder / name)
    assert restore_state(_runtime(method), str(folder), step) is True
    reset_driver_anchors()


@pytest.mark.parametrize("method", list(VALID))
@pytest.mark.parametrize("kind", ["fifo", "link to a fifo", "link to /dev/zero", "link to /dev/null", "folder",
                                  "link to a folder", "socket"])
def test_a_state_path_that_is_not_a_regular_file_ends_the_resume_in_one_line_at_once(tmp_path, method, kind):
    import socket

    name, step, _ = VALID[method]
    folder = tmp_path / f"global_step_{step}"
    folder.mkdir()
    path = folder / name
    expected = {"fifo": "(a FIFO)", "link to a fifo": f"(a link to {tmp_path / 'pipe'}, a FIFO)",
                "link to /dev/zero": "(a link to /dev/zero, a character device)",
                "link to /dev/null": "(a link to /dev/null, a character device)", "folder": "(a folder)",
                "link to a folder": f"(a link to {tmp_path}, a folder)", "socket": "(a socket)"}[kind]
    held = None
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a fifo":
        os.mkfifo(tmp_path / "pipe")
        os.symlink(tmp_path / "pipe", path)
    elif kind in ("link to /dev/zero", "link to /dev/null"):
        os.symlink("/dev/zero" if "zero" in kind else "/dev/null", path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link to a folder":
        os.symlink(tmp_path, path)
    else:
        held = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(folder)  # an AF_UNIX address holds 108 bytes, less than a test worker's tmp_path: bind by name
        try:
            held.bind(name)
        finally:
            os.chdir(cwd)
    try:
        message = _refused(method, folder, step)
    finally:
        if held is not None:
            held.close()
    assert message.endswith(f": it is not a regular file {expected}" + (
        f": step {step} is the first of a CoDaPO pair and step {step + 1} trains on its kept prompts; resume from "
        "an even step's checkpoint (trainer.resume_mode=resume_path), or set algorithm.codapo.resample=false"
        if method == "codapo" else "; set algorithm.apo.on_missing_state=fresh to start the anchor fresh instead"
        if method == "apo" else "")), message


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_the_codec_reads_no_device(device):
    with pytest.raises(StateFileError, match=r"^it is not a regular file \(a character device\)$"):
        read_state(device, "x")


def test_a_link_to_nothing_says_where_it_points(tmp_path):
    os.symlink(tmp_path / "gone.json", tmp_path / AGPO_FILE)
    assert _refused("agpo_dual", tmp_path, 3).endswith(f": it is missing (a link to {tmp_path / 'gone.json'}, "
                                                        "which does not exist)")


@pytest.mark.parametrize("method, bound", [("agpo_dual", 64 * 2**10), ("apo", 256 * 2**20),
                                           ("codapo", 256 * 2**20)])
def test_a_state_file_past_its_bound_is_refused_before_it_is_read(tmp_path, method, bound):
    from recipe_apo.methods.state_codec import MAX_STATE_BYTES

    assert MAX_STATE_BYTES == 256 * 2**20
    name, step, valid = VALID[method]
    text = json.dumps(valid())
    # At the bound: a valid file padded with whitespace is still read (AGPO's only: the others' bound is 256 MiB).
    if bound < 2**20:
        (tmp_path / name).write_text(text + " " * (bound - len(text)))
        assert restore_state(_runtime(method), str(tmp_path), step) is True
    # One byte more: refused from its size alone (a sparse file: nothing of it is on disk, and nothing is read).
    with open(tmp_path / name, "w") as handle:
        handle.write(text)
        handle.truncate(bound + 1)
    assert f": it holds {bound + 1} bytes, more than the {bound} a state file of this method may hold" in \
        _refused(method, tmp_path, step)


def test_the_codec_stops_reading_at_its_bound(tmp_path):
    path = tmp_path / "x_state.json"
    path.write_text('{"kind": "x"}' + " " * 100)
    with pytest.raises(StateFileError, match=r"^it holds 113 bytes, more than the 112 a state file"):
        read_state(str(path), "x", max_bytes=112)
    assert read_state(str(path), "x", max_bytes=113) == ({}, None)


# Files that parse, but whose keys or numbers the recipe never writes: (method, the state's changes, the cause).
FOREIGN = [
    ("apo", lambda v: {**v, "extra": 1}, "keys the recipe does not write: 'extra'"),
    ("apo", lambda v: {**v, "anchors": {"global": {**GOOD_ANCHOR, "rate": 0.1, "zz": 2}}},
     "keys the recipe does not write: 'rate', 'zz'"),
    ("apo", lambda v: {**v, **{f"k{i}": i for i in range(8)}},
     "keys the recipe does not write: 'k0', 'k1', 'k2', 'k3', 'k4' and 3 more"),
    ("agpo_dual", lambda v: {**v, "extra": 0.0}, "AGPO state holds keys the recipe does not write: 'extra'"),
    ("codapo", lambda v: {**v, "extra": []}, "it holds keys the recipe does not write: 'extra'"),
    # Numbers past what a writer reaches.
    ("apo", lambda v: {**v, "global_step": 10**30}, "global_step 1000000000000000000000000000000 is not a whole "
                                                     "number in [0, 9007199254740991]"),
    ("agpo_dual", lambda v: {**v, "global_step": -1}, "global_step -1 is not a whole number"),
    ("codapo", lambda v: {**v, "global_step": True}, "global_step True is not a whole number"),
    ("apo", lambda v: _anchor(v, steps=10**30), "steps must be an integer in [0, 9007199254740991], got "
                                                "1000000000000000000000000000000"),
    ("apo", lambda v: _anchor(v, steps=2**53), "steps must be an integer in [0, 9007199254740991], got "
                                               "9007199254740992"),
    ("apo", lambda v: json.dumps(_anchor(v, steps=2)).replace('"steps": 2', '"steps": ' + "9" * 5000),
     "it cannot be read (ValueError: Exceeds the limit (4300 digits)"),
    ("agpo_dual", lambda v: {**v, "kl_avg": 1e39}, "AGPO state kl_avg must be a number in [0, 6.80565e+38], got 1e+39"),
    ("agpo_dual", lambda v: {**v, "uncertainty_avg": 10**300},
     "AGPO state uncertainty_avg must be a number in [0, 3.40282e+44], got 1000000000000000000000000000000000000"),
    ("agpo_dual", lambda v: {**v, "entropy_ref": 23.0}, "AGPO state entropy_ref must be a number in [0, 22.1807], "
                                                        "got 23.0"),
    ("agpo_dual", lambda v: {**v, "kl_avg": 10**400}, "it cannot be read (OverflowError"),
    ("codapo", lambda v: {**v, "step": 10**30}, "it is not the kept prompts of step 5 (step "
                                                "1000000000000000000000000000000)"),
    ("codapo", lambda v: {**v, "step": 5.0}, "it is not the kept prompts of step 5 (step 5.0)"),
    # Histories and tables longer than their writer keeps.
    ("apo", lambda v: _anchor(v, history=[0.5] * 1_000_000, history_len=100_000, steps=2_000_000),
     "a history of 1000000 values is longer than its history_len 100000"),
    ("apo", lambda v: _anchor(v, history=[0.5] * 7, steps=20), "a history of 7 values is longer than its "
                                                               "history_len 6"),
    ("apo", lambda v: _anchor(v, history=[0.4, 0.45, 0.5], steps=1), "a history of 3 values after 1 updates"),
    ("apo", lambda v: _anchor(v, history=[0.5, 0.4]), "the history must end at the value"),
    ("apo", lambda v: _anchor(v, value=None), "the history must end at the value"),
    ("apo", lambda v: _anchor(v, value=None, history=[], steps=3), "no value after 3 updates"),
    ("codapo", lambda v: {**v, "kept": {"q": "abc"}}, "its kept prompts' column 'q' is not a list of rows"),
    ("codapo", lambda v: {**v, "kept": {"q": list(range(33))}},
     "it keeps 33 prompts, more than a step draws (data.train_batch_size=32)"),
]


def _anchor(state, **fields):
    return {**state, "anchors": {"global": {**GOOD_ANCHOR, **fields}}}


@pytest.mark.parametrize("method, change, cause", FOREIGN, ids=[f"{m}-{c[:40]}" for m, _, c in FOREIGN])
def test_a_state_whose_keys_or_numbers_no_writer_gives_is_refused_naming_the_file(tmp_path, method, change, cause):
    name, step, valid = VALID[method]
    _write(tmp_path, method, change(valid()))
    if method == "codapo":  # a run that draws 32 prompts a step
        fresh = runtime("codapo", codapo={"resample": True})
        fresh.config = OmegaConf.merge(fresh.config, {"data": {"train_batch_size": 32}})
        with pytest.raises(MethodStateError) as info:
            restore_state(fresh, str(tmp_path), step)
        message = str(info.value)
        assert fresh.kept is None
    else:
        message = _refused(method, tmp_path, step)
    assert message.startswith(f"{REFUSAL[method]} {tmp_path / name}: ") and "\n" not in message
    assert cause in message, message
    assert len(message) < 600


def test_an_anchor_state_as_the_writer_leaves_it_at_each_stage_restores(tmp_path):
    """The bounds above are the writer's own: a fresh anchor, a warm start, a full history all restore."""
    from recipe_apo.methods.apo.anchor import CapabilityAnchor

    stages = [CapabilityAnchor(init=None, history=3), CapabilityAnchor(init=0.2, history=3)]
    full = CapabilityAnchor(init=0.2, history=3)
    for y in (0.1, 0.9, 0.4, 0.6, 0.3):
        full.update(y, eta=1.0, eta_min=0.05, history=3)
    warm = CapabilityAnchor(init=None, history=3)
    warm.update(0.7, eta=1.0, eta_min=0.05, history=3)
    for anchor in stages + [full, warm]:
        copy = CapabilityAnchor(history=3)
        copy.load_state_dict(json.loads(json.dumps(anchor.state_dict())))
        assert copy.state_dict() == anchor.state_dict()
