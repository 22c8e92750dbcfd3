"""The group filter's cap (``algorithm.filter_groups.max_num_gen_batches``) on verl 0.9.1's own replay buffers,
without Ray: TransferQueue is replaced by an in-memory store of prompt groups and their rewards (what the buffer
reads: ``kv_list``, ``kv_batch_get`` of ``rm_scores``, ``kv_clear``), the rollout by a script that hands out groups
whose rewards are all equal (no signal: the filter drops them) or not, and verl's poll wait by a counter.
"""

from __future__ import annotations

import itertools
import logging
from types import SimpleNamespace

import pytest
import torch
import verl.trainer.ppo.v1.replay_buffer as replay_buffer
from helpers.composing import compose_recipe
from omegaconf import open_dict
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from recipe_apo.integration import verl_access
from recipe_apo.integration.modes import recipe_mode
from recipe_apo.integration.refill_cap import RefillCap, RefillCapError
from recipe_apo.integration.validation import RecipeConfigError, route_agent_loops, validate_recipe_config

SOLVED, SIGNAL = (1.0, 1.0), (1.0, 0.0)  # a group of two responses: all right (dropped), one right (kept)
SPIN = 30  # polls of verl's loop with nothing in flight that count as spinning


class Store:
    """TransferQueue's training partition as verl's replay buffer reads it. A group is sent "running" or
    "finished"; with ``finish_every=k`` every k-th look at the store (``kv_list``) finishes the oldest running
    group, as a rollout in flight does."""

    def __init__(self, finish_every: int = 1):
        self.prompts: dict[str, dict] = {}
        self.rewards: dict[str, float] = {}  # trajectory key -> its reward
        self.finish_every, self.looks, self.sent = finish_every, 0, 0

    def send(self, groups, status: str) -> None:
        for rewards in groups:
            uid = f"g{self.sent}"  # verl reads a key's uid as the part before its first "_"
            self.sent += 1
            self.prompts[uid] = {"is_prompt": True, "status": status, "global_steps": 1}
            for session, reward in enumerate(rewards):
                self.rewards[f"{uid}_{session}_0"] = reward

    def kv_list(self, partition_id=None):
        self.looks += 1
        running = [uid for uid, tag in self.prompts.items() if tag["status"] == "running"]
        if running and self.looks % self.finish_every == 0:
            self.prompts[running[0]]["status"] = "finished"
        items = {uid: dict(tag) for uid, tag in self.prompts.items()}
        for key in self.rewards:
            if self.prompts.get(key.split("_")[0], {}).get("status") == "finished":
                items[key] = {"is_prompt": False, "global_steps": 1}
        return {"train": items}

    def kv_batch_get(self, keys, partition_id, select_fields):
        assert select_fields == ["rm_scores"]
        return {"rm_scores": [torch.tensor([0.0, self.rewards[key]]) for key in keys]}

    def kv_clear(self, partition_id, keys):
        for key in keys:
            self.prompts.pop(key, None)
            self.rewards.pop(key, None)


class Rollout:
    """The trainer's ``_add_prompts_to_generate`` as the buffer's ``refill_fn``: each prompt sent gets the next
    group of ``script``; more than ``limit`` prompts in one test is generating without end."""

    def __init__(self, store: Store, script, status: str = "finished", limit: int = 200):
        self.store, self.script, self.status, self.limit = store, iter(script), status, limit
        self.calls: list[int] = []

    def __call__(self, num_prompts: int) -> int:
        assert num_prompts > 0  # verl's dataloader refuses 0
        self.calls.append(num_prompts)
        if sum(self.calls) > self.limit:
            raise AssertionError(f"generating without end: {sum(self.calls)} refill prompts")
        self.store.send(itertools.islice(self.script, num_prompts), self.status)
        return num_prompts


@pytest.fixture
def polls(monkeypatch):
    """verl's wait between two looks, without the sleep: each call's (refills withheld, groups in flight)."""
    seen: list[tuple[int, int]] = []

    def wait(self, partition_id, last_debug_time):
        in_flight = len(self.pending_keys[partition_id]) + len(self.running_keys[partition_id])
        cap = getattr(self, "test_cap", None)
        seen.append((cap.withheld if cap else 0, in_flight))
        if in_flight == 0 and len(seen) >= SPIN:
            raise AssertionError(f"spinning: {len(seen)} polls with nothing in flight")
        return last_debug_time

    monkeypatch.setattr(ReplayBuffer, "_wait_for_next_poll", wait)
    return seen


def buffer_on(monkeypatch, store: Store, rollout: Rollout, batch: int, cap: RefillCap | None,
              mode: str = "sync") -> ReplayBuffer:
    """verl's replay buffer of ``mode`` with the group filter on (metric ``reward``), as verl's trainer builds it
    (``trainer_base.py:139-185``: one prompt a dataloader fetch, one batch in flight), and the cap when given."""
    monkeypatch.setattr(replay_buffer, "tq", store)
    cls = ReplayBuffer if mode == "sync" else ReplayBufferAsync
    buffer = cls(trainer_mode=mode, trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop",
                 sampler_kwargs={}, poll_interval=0.0, refill_fn=rollout, filter_groups_metric="reward",
                 train_batch_size=batch, gen_batch_size=1, max_inflight_gen_batches=1)
    if cap is not None:
        cap.begin_step(7)
        assert verl_access.cap_refills(buffer, cap)
        buffer.test_cap = cap
    return buffer


def stop_line(monkeypatch, polls, first, script, batch, cap_batches, mode="sync", **store):
    """The one line a step stops with: ``first`` is the step's own batch, ``script`` its refills."""
    data = Store(**store)
    data.send(first, "finished")
    rollout = Rollout(data, script)
    cap = RefillCap(cap_batches, batch)
    buffer = buffer_on(monkeypatch, data, rollout, batch, cap, mode)
    with pytest.raises(RefillCapError) as info:
        buffer.sample(global_steps=7, partition_id="train", batch_size=batch)
    line = str(info.value)
    assert "\n" not in line
    return line, rollout, cap


def test_a_filter_that_cannot_fill_stops_at_the_cap_with_one_line_before_it_waits(monkeypatch, polls):
    line, rollout, cap = stop_line(monkeypatch, polls, [SOLVED] * 4, itertools.repeat(SOLVED), batch=4, cap_batches=3)
    assert line == (
        "algorithm.filter_groups.max_num_gen_batches=3: step 7 generated 3 batches of data.train_batch_size=4 "
        "prompts and has 0 groups with a signal of the 4 it needs (the group filter drops every group whose "
        "responses all score alike: the policy solves, or fails, nearly every prompt it draws); stopped instead of "
        "refilling without end: train on prompts the policy sometimes solves, raise "
        "algorithm.filter_groups.max_num_gen_batches, set it to 0 for no cap, or turn the filter off "
        "(algorithm.filter_groups.enable=false)")
    # 4 own prompts, then (3 - 1) x 4 = 8 refill prompts sent, in verl's slots of one batch in flight: 12 in all.
    assert rollout.calls == [4, 4] and cap.refilled == 8 and cap.withheld > 0
    assert polls == []  # stopped where verl would first have waited


def test_verls_own_buffer_refills_the_same_filter_without_end(monkeypatch, polls):
    data = Store()
    data.send([SOLVED] * 4, "finished")
    rollout = Rollout(data, itertools.repeat(SOLVED))
    buffer = buffer_on(monkeypatch, data, rollout, batch=4, cap=None)
    with pytest.raises(AssertionError, match="generating without end"):
        buffer.sample(global_steps=7, partition_id="train", batch_size=4)


def test_a_filter_that_fills_within_the_cap_takes_the_batch_verl_takes_without_it(monkeypatch, polls):
    """The step's own 4 prompts keep 2 groups; verl asks for 2 x 2 refill prompts (its sync mode sends two for
    each group dropped), which keep all 4: 6 groups, the batch's 4 taken, 2 discarded (verl's sync mode keeps no
    surplus). One refill batch allowed (max_num_gen_batches=2) is enough; none allowed (1) stops the run."""
    taken = {}
    for cap_batches in (None, 2, 3):
        data = Store()
        data.send([SOLVED, SIGNAL, SOLVED, SIGNAL], "finished")
        rollout = Rollout(data, itertools.repeat(SIGNAL))
        cap = None if cap_batches is None else RefillCap(cap_batches, 4)
        buffer = buffer_on(monkeypatch, data, rollout, batch=4, cap=cap)
        batch, metrics = buffer.sample(global_steps=7, partition_id="train", batch_size=4)
        groups = {key.split("_")[0] for key in batch.keys}
        taken[cap_batches] = (len(groups), len(batch.keys), rollout.calls, metrics)
        assert cap is None or (cap.refilled, cap.withheld) == (4, 0)
    assert taken[2] == taken[3] == taken[None] == (4, 8, [4], {"training/filter_groups/evicted_samples": 2,
                                                               "_dapo_filtered_reward_counts": {1.0: 2},
                                                               "training/filter_groups/discarded_surplus_samples": 2})
    line, rollout, _ = stop_line(monkeypatch, polls, [SOLVED, SIGNAL, SOLVED, SIGNAL], itertools.repeat(SIGNAL),
                                 batch=4, cap_batches=1)
    assert line.startswith("algorithm.filter_groups.max_num_gen_batches=1: step 7 generated 1 batch of "
                           "data.train_batch_size=4 prompts and has 2 groups with a signal of the 4 it needs")
    assert rollout.calls == []


def test_a_withheld_refill_waits_for_the_groups_in_flight_which_may_still_fill_the_batch(monkeypatch, polls):
    """A rollout that finishes one group every third look: the cap's last refill is withheld while groups are
    still generating, and they fill the batch; a stop at the first refusal would have been premature."""
    data = Store(finish_every=3)
    data.send([SOLVED, SOLVED], "running")
    rollout = Rollout(data, itertools.repeat(SIGNAL), status="running")
    cap = RefillCap(2, 2)
    buffer = buffer_on(monkeypatch, data, rollout, batch=2, cap=cap)
    batch, _ = buffer.sample(global_steps=7, partition_id="train", batch_size=2)
    assert len({key.split("_")[0] for key in batch.keys}) == 2
    assert cap.refilled == 2 and cap.withheld > 0
    assert any(withheld and in_flight for withheld, in_flight in polls)  # waited, refused, with groups in flight


def test_the_same_when_the_groups_in_flight_do_not_fill_it(monkeypatch, polls):
    data = Store(finish_every=3)
    data.send([SOLVED, SOLVED], "running")
    rollout = Rollout(data, itertools.chain([SIGNAL], itertools.repeat(SOLVED)), status="running")
    cap = RefillCap(2, 2)
    buffer = buffer_on(monkeypatch, data, rollout, batch=2, cap=cap)
    with pytest.raises(RefillCapError, match="generated 2 batches of data.train_batch_size=2 prompts and has 1 "
                                             "groups with a signal of the 2 it needs"):
        buffer.sample(global_steps=7, partition_id="train", batch_size=2)
    assert polls[-1][1] > 0  # the last wait was for groups in flight; the stop came when none was left


def test_verls_asynchronous_buffer_stops_at_the_cap_too(monkeypatch, polls):
    """Its loop refills one prompt for each group it drops, the same cap: 4 own + 4 refill prompts."""
    line, rollout, cap = stop_line(monkeypatch, polls, [SOLVED, SIGNAL, SOLVED, SOLVED], itertools.repeat(SOLVED),
                                   batch=4, cap_batches=2, mode="colocate_async")
    assert line.startswith("algorithm.filter_groups.max_num_gen_batches=2: step 7 generated 2 batches of "
                           "data.train_batch_size=4 prompts and has 1 groups with a signal of the 4 it needs")
    assert rollout.calls == [3, 1] and cap.refilled == 4


def test_the_budget_resets_each_step_and_validation_is_never_capped():
    cap = RefillCap(3, 4)
    cap.begin_step(1)
    assert [cap.grant(n) for n in (4, 3, 4, 2)] == [4, 3, 1, 0] and (cap.refilled, cap.withheld) == (8, 5)
    cap.check(sampleable=1, in_flight=2)  # refused refills, but groups still coming: no stop
    with pytest.raises(RefillCapError, match="step 1 generated 3 batches"):
        cap.check(sampleable=1, in_flight=0)
    cap.begin_step(2)
    assert (cap.step, cap.refilled, cap.withheld) == (2, 0, 0)
    cap.check(sampleable=0, in_flight=0)  # nothing withheld this step: verl's own wait

    buffer = SimpleNamespace(filter_groups_metric="reward", refill_fn=lambda n: n, sample=None,
                             _wait_for_next_poll=lambda p, t: t, finished_keys={}, failure_keys={},
                             pending_keys={}, running_keys={})
    assert verl_access.cap_refills(buffer, cap)
    cap.withheld = 1
    assert buffer._wait_for_next_poll("val", 5.0) == 5.0  # the validation partition (and AGPO's probe)
    assert not verl_access.cap_refills(SimpleNamespace(filter_groups_metric=None, refill_fn=None), cap)


def test_what_max_num_gen_batches_means():
    """AGPO's preset: the authors' 10; a non-positive value is verl's "no upper limit"; the filter off, no cap."""
    config = compose_recipe("method=agpo")
    cap = RefillCap.from_config(config)
    assert (cap.max_num_gen_batches, cap.train_batch_size, cap.budget) == (
        10, config.data.train_batch_size, 9 * config.data.train_batch_size)
    assert RefillCap.from_config(compose_recipe("method=agpo", "algorithm.filter_groups.max_num_gen_batches=1")
                                 ).budget == 0
    for value in ("0", "-1"):
        assert RefillCap.from_config(compose_recipe(
            "method=agpo", f"algorithm.filter_groups.max_num_gen_batches={value}")) is None
    assert RefillCap.from_config(compose_recipe("method=agpo", "algorithm.filter_groups.enable=false")) is None
    assert RefillCap.from_config(compose_recipe("method=grpo")) is None  # verl's default: the filter off


def test_a_cap_that_is_not_a_whole_number_is_refused_at_launch():
    config = compose_recipe("method=agpo", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.name=vllm",
                            "algorithm.filter_groups.max_num_gen_batches=ten", resolve=False)
    with open_dict(config):
        config.trainer.v1.trainer_mode = recipe_mode("sync")
    route_agent_loops(config)
    with pytest.raises(RecipeConfigError) as info:
        validate_recipe_config(config)
    assert str(info.value) == "algorithm.filter_groups.max_num_gen_batches must be an integer, got 'ten'"


def test_the_recipes_trainer_caps_verls_buffer_and_drops_verls_ignored_warning(tmp_path, recipe_config,
                                                                             bare_trainer, monkeypatch, caplog,
                                                                             capsys):
    trainer = bare_trainer(recipe_config(tmp_path, method="agpo"))
    trainer.trainer_mode = "sync"
    caplog.set_level(logging.WARNING, logger="verl.trainer.ppo.v1.trainer_base")
    PPOTrainerSync._build_replay_buffer(trainer)  # verl's own: it says the setting is ignored
    assert any("is ignored by the built-in V1 ReplayBuffer" in r.getMessage() for r in caplog.records)
    caplog.clear()

    sent = []
    monkeypatch.setattr(type(trainer), "_add_prompts_to_generate", lambda self, n: sent.append(n) or n)
    capsys.readouterr()
    buffer = trainer._build_replay_buffer()
    assert not any("is ignored" in r.getMessage() for r in caplog.records)
    assert capsys.readouterr().out.startswith("recipe-apo: algorithm.filter_groups.max_num_gen_batches=10: ")
    cap = trainer.refill_cap
    assert (cap.max_num_gen_batches, cap.train_batch_size) == (10, trainer.config.data.train_batch_size)
    cap.begin_step(1)
    cap.refilled = cap.budget - 1
    buffer.refill_fn(5)  # the buffer's refills go through the cap to the trainer's
    assert sent == [1] and (cap.refilled, cap.withheld) == (cap.budget, 4)

    monkeypatch.setattr(PPOTrainerSync, "step", lambda self, metrics, timing_raw: "batch")
    trainer.global_steps = 4
    assert trainer.step({}, {}) == "batch" and (cap.step, cap.refilled, cap.withheld) == (4, 0, 0)
