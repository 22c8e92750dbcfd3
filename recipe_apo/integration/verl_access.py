"""Every internal of verl's V1 trainer that the recipe's trainer touches, in one module, each named here.

The adapter (``recipe_apo.integration.trainer``) overrides verl's hand-off methods (``_load_checkpoint``,
``_save_checkpoint``, ``step``, ``_next_train_batch``, ``_compute_advantage``, ``_update_actor``,
``_log_rollout_data``) and reaches, through the functions below only, into:

- TransferQueue, where a V1 step's fields live (``tq.kv_batch_get/put/clear``, the batch handle's ``keys``,
  ``partition_id``, ``tags``, ``fields`` and ``extra_info``), read padded and written nested as verl does;
- the trainer's ``global_steps``, ``config``, ``tokenizer`` and ``timing_raw`` (``marked_timer``);
- its workers: ``actor_rollout_wg.set_loss_fn`` (a registered worker method) and ``.compute_log_prob``;
- its rollout on the validation path, as ``_validate`` runs it: ``agent_loop_manager.generate_sequences``,
  ``replay_buffer.sample(partition_id="val")``, and in colocated reward mode ``checkpoint_manager.sleep_replicas`` /
  ``update_weights`` around the private ``_compute_reward_colocate``;
- the rollout dump's writer, ``_dump_generations`` (``dumping_with``);
- the function of verl's trainer module that its ``_compute_advantage`` looks up at call time for a multi-output
  step, ``trainer_base.compute_advantage_for_multi_trajectories`` (``multi_trajectory_advantage_replaced``: the
  recipe's final-output rule, ``recipe_apo.integration.multi_output``);
- the dataloader's prompt batches (TensorDicts, ``verl.utils.tensordict_utils``);
- the replay buffer's group filter (``trainer.replay_buffer``, built by ``_build_replay_buffer``): its ``refill_fn``,
  ``sample``, ``wait_for_sampleable`` (asynchronous modes), the private ``_wait_for_next_poll`` (where its polling
  loops wait; ``replay_buffer.py:408-419``, called at ``:503`` and ``:590``) and its ``pending_keys``,
  ``running_keys``, ``finished_keys``, ``failure_keys`` (``cap_refills``); and verl's warning that
  ``max_num_gen_batches`` is ignored (``trainer_base.py:205-211``, ``cap_warning_dropped``).

verl 0.9.1's line numbers are in ``docs/internals.md``; a verl release that changes one of these is a change here.
What the recipe touches of verl in its worker processes (the actor's engine and loss, the agent loop worker) is
``recipe_apo.integration.verl_worker_access``'s.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np
import torch

from recipe_apo.integration.refill_cap import RefillCap
from recipe_apo.integration.sampling import COLUMN_PREFIX, INNER_KEY
from recipe_apo.integration.sampling import NAME as SAMPLING_LOOP
from recipe_apo.integration.verl_worker_access import HEAD_KEY, RESTART_KEY, ColumnLoss
from recipe_apo.methods.base import Probe, Prompts, StepBatch, Trajectories
from recipe_apo.methods.errors import BatchInputError, MethodStateError

# The batch fields a runtime may need (``MethodRuntime.needs``) beside uids, scores and the mask, by verl's names.
FIELDS = {"old_log_probs": "old_log_probs", "entropy": "entropy", "advantages": "advantages"}


# ---- TransferQueue ------------------------------------------------------------------------------------------------
def read(batch: Any, fields: Sequence[str]) -> Any:
    """The ``fields`` of every row of ``batch``, in ``batch.keys`` order (a TensorDict of nested tensors)."""
    import transfer_queue as tq

    return tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(fields))


def write_padded(batch: Any, fields: Mapping[str, torch.Tensor], nested_like: Any) -> None:
    """Store padded ``(n, T)`` tensors back as nested rows shaped like ``nested_like`` (a nested mask)."""
    import transfer_queue as tq
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested

    nested = {name: response_to_nested(value, nested_like) for name, value in fields.items()}
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(nested, batch_size=len(batch)))


def add_row_columns(batch: Any, columns: Mapping[str, np.ndarray]) -> None:
    """New per-row float columns in the batch, listed in the handle's ``fields`` (verl's update fetches those)."""
    import transfer_queue as tq
    from tensordict import TensorDict

    values = {name: torch.as_tensor(np.asarray(v, dtype=np.float32)) for name, v in columns.items()}
    written = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                              fields=TensorDict(values, batch_size=len(batch)))
    if batch.fields is not None:
        batch.fields = list(written.fields)


def data_sources(batch: Any, readers: str = "the run") -> np.ndarray:
    """Each row's ``data_source``; ``BatchInputError`` naming who reads it (``readers``) and the remedy when the
    dataset has none."""
    try:
        sources = read(batch, ["data_source"])["data_source"]
    except Exception as exc:  # the storage's own error types vary with its backend
        raise BatchInputError(
            f"{readers} reads each row's data_source, but the batch has no data_source field ({exc}); add "
            "data_source to your dataset rows or turn off the setting that reads it"
        ) from exc
    return np.asarray(sources.tolist() if hasattr(sources, "tolist") else list(sources), dtype=object)


def step_batch(batch: Any, trajectories: Trajectories, needs: frozenset,
               readers: str = "the run") -> tuple[StepBatch, Any]:
    """The step's rows as a runtime sees them (``recipe_apo.methods.base.StepBatch``), reading from TransferQueue
    the uids, the reward's scores (``rm_scores``), the mask and what the runtimes need, padded as verl pads them;
    and the nested mask (``write_padded`` shapes rows like it)."""
    # The advantages are read after verl's advantage step (``read``), not here.
    fields = ["uid", "rm_scores", "response_mask",
              *(FIELDS[n] for n in sorted(needs) if n in FIELDS and n != "advantages")]
    data = read(batch, fields)
    padded = {name: data[name].to_padded_tensor(padding=0.0) for name in fields[1:]}
    out = StepBatch(uids=np.array([str(u) for u in data["uid"]], dtype=object),
                    token_level_scores=padded["rm_scores"], response_mask=padded["response_mask"],
                    trajectories=trajectories, old_log_probs=padded.get("old_log_probs"),
                    entropy=padded.get("entropy"))
    if "data_sources" in needs:
        out.data_sources = data_sources(batch, readers)
    return out, data["response_mask"]


# ---- the trainer's own objects --------------------------------------------------------------------------------------
def global_steps(trainer: Any) -> int:
    return int(trainer.global_steps)


@contextlib.contextmanager
def timed(trainer: Any, name: str) -> Iterator[None]:
    """``timing_s/<name>`` in the step's metrics (verl's ``marked_timer`` on the trainer's ``timing_raw``)."""
    from verl.utils.debug import marked_timer

    with marked_timer(name, trainer.timing_raw):
        yield


def install_column_loss(trainer: Any, columns: Sequence[str]) -> None:
    """The actor workers' loss becomes verl's ``ppo_loss`` with the micro-batch's ``columns`` handed to the policy
    loss (``verl_worker_access.ColumnLoss``), through verl's registered ``set_loss_fn``."""
    trainer.actor_rollout_wg.set_loss_fn(ColumnLoss(actor_loss_config(trainer.config), tuple(columns)))


def actor_loss_config(config: Any) -> Any:
    """The actor config verl's worker builds for ``ppo_loss`` (``omega_conf_to_dataclass`` of
    ``actor_rollout_ref.actor``), built on the driver."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def hand_actor_call(batch: Any, logits_head: Optional[str], restart_at: int) -> None:
    """The actor's next pass of ``batch`` computes with ``logits_head`` (None: the model's default) and, for an
    update, restarts the optimizer first when ``restart_at`` (the step) is >= 0: the batch handle's ``extra_info``,
    which verl hands the workers as the batch's metadata (and keeps between passes: every pass sets both)."""
    if logits_head is None:
        batch.extra_info.pop(HEAD_KEY, None)
    else:
        batch.extra_info[HEAD_KEY] = str(logits_head)
    batch.extra_info[RESTART_KEY] = int(restart_at)


def policy_log_probs(trainer: Any, batch: Any) -> torch.Tensor:
    """The current policy's token log-probs of ``batch``'s responses, padded (one more forward pass of the actor,
    no entropy, no loss), at the rollout's temperature as verl's old log-probs are."""
    from verl.workers.utils.padding import response_from_nested

    batch.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                             "temperature": trainer.config.actor_rollout_ref.rollout.temperature})
    trainer.actor_rollout_wg.compute_log_prob(batch)
    data = read(batch, ["log_probs", "response_mask"])
    return response_from_nested(data["log_probs"], data["response_mask"]).to_padded_tensor(padding=0.0)


@contextlib.contextmanager
def dumping_with(trainer: Any, batch: Any, fields: Mapping[str, list]) -> Iterator[None]:
    """While held, verl's rollout dump writes ``fields`` (one value per row of ``batch``) as extra columns."""
    if not fields:
        yield
        return
    position = {key: i for i, key in enumerate(batch.keys)}
    write = trainer._dump_generations

    def write_with_fields(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        # verl sorts the rows by uid before writing; its "uid" list says in which order.
        order = [position[key] for key in reward_extra_infos_dict["uid"]]
        extra = {name: [values[i] for i in order] for name, values in fields.items()}
        return write(inputs, outputs, gts, scores, {**reward_extra_infos_dict, **extra}, dump_path)

    trainer._dump_generations = write_with_fields
    try:
        yield
    finally:
        del trainer._dump_generations


# ---- verl's V1 advantage step ---------------------------------------------------------------------------------------
# The name in verl's trainer module that its ``_compute_advantage`` calls (looked up at call time).
MULTI_TRAJECTORY_ADVANTAGE = "compute_advantage_for_multi_trajectories"


@contextlib.contextmanager
def multi_trajectory_advantage_replaced(replacement: Optional[Callable[..., Any]], estimator: Any) -> Iterator[None]:
    """While held, verl's V1 advantage step calls ``replacement(data, batch_keys, adv_estimator, **kwargs)`` where it
    calls its own ``compute_advantage_for_multi_trajectories`` (None: verl's own); verl's own again afterwards, also
    on an error. A verl without that function is ``MultiOutputError`` (naming the run's ``estimator``)."""
    if replacement is None:
        yield
        return
    from verl.trainer.ppo.v1 import trainer_base

    from recipe_apo.integration.multi_output import MultiOutputError
    from recipe_apo.methods import driver_state

    if getattr(trainer_base, MULTI_TRAJECTORY_ADVANTAGE, None) is None:
        raise MultiOutputError(f"multi-output: verl's trainer_base has no {MULTI_TRAJECTORY_ADVANTAGE} (not verl "
                               f"0.9.1?): the final-output rule for {estimator} cannot be applied")
    with driver_state.swapped(trainer_base, MULTI_TRAJECTORY_ADVANTAGE, replacement):
        yield


# ---- prompt batches -------------------------------------------------------------------------------------------------
def prompts_of(batch: Any) -> Prompts:
    """The dataloader's prompt batch (a TensorDict) as a runtime sees it; its table is built when a runtime reads
    it (CoDaPO keeps it), and ``source`` is the batch itself (the probe samples it)."""
    return _LazyPrompts(np.array([str(u) for u in batch["uid"]], dtype=object), batch)


class _LazyPrompts(Prompts):
    def __init__(self, uids: np.ndarray, batch: Any) -> None:
        super().__init__(uids, {})
        self.source = batch
        self._table: Optional[dict] = None

    @property  # type: ignore[override]
    def columns(self) -> dict[str, Any]:
        if self._table is None:
            self._table = prompt_table(self.source)
        return self._table

    @columns.setter
    def columns(self, value: dict) -> None:
        self._table = value or None


def prompt_table(batch: Any) -> dict[str, Any]:
    """A prompt TensorDict as columns: tensors stay tensors, every other field a list of its rows' values (the
    per-batch metadata, ``global_steps``, is left out: the batch that replays the prompts sets its own)."""
    from tensordict import NonTensorData

    table = {}
    for key in batch.keys():
        if key == "uid":
            continue
        value = batch.get(key)
        if isinstance(value, NonTensorData):
            continue
        table[key] = value.clone() if isinstance(value, torch.Tensor) else list(value.tolist())
    return table


def prompt_batch(table: Mapping[str, Any], step: int) -> Any:
    """A prompt TensorDict from a table of ``prompt_table``'s form, each row a fresh uid (a fresh group)."""
    from verl.utils import tensordict_utils as tu

    rows = {len(v) for v in table.values()}
    if len(rows) != 1:
        raise MethodStateError(f"a prompt table's columns differ in length ({sorted(rows)})")
    columns = {key: (value if isinstance(value, torch.Tensor) else _rows(value)) for key, value in table.items()}
    columns["uid"] = np.array([str(uuid.uuid4()) for _ in range(rows.pop())], dtype=object)
    batch = tu.get_tensordict(columns)
    tu.assign_non_tensor_data(batch, "global_steps", step)
    return batch


def _rows(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def route_sampling(batch: Any, settings: Mapping[str, np.ndarray], default_loop: str) -> None:
    """Every prompt of ``batch`` runs its own agent loop inside ``recipe_sampling`` with its ``settings`` (name ->
    one value per prompt) as per-request sampling parameters."""
    from verl.utils import tensordict_utils as tu

    for name, values in settings.items():
        batch[COLUMN_PREFIX + name] = torch.as_tensor(np.asarray(values, dtype=np.float32))
    if INNER_KEY not in batch.keys():
        inner = [str(name) for name in batch["agent_name"]] if "agent_name" in batch.keys() else None
        tu.assign_non_tensor_stack(batch, INNER_KEY, inner or [default_loop] * len(batch))
        tu.assign_non_tensor_stack(batch, "agent_name", [SAMPLING_LOOP] * len(batch))


# ---- the validation path: a probe ----------------------------------------------------------------------------------
def probe(trainer: Any, prompts: Prompts, samples: int, temperature: float,
          answer_key: Callable[[str], str]) -> Probe:
    """``samples`` responses to each prompt at ``temperature`` on verl's validation path (partition ``val``, as
    ``_validate`` runs it, so the probe never mixes with training rollouts), scored by the run's reward and
    cleared; their rewards (prompts, samples), answer keys and response token count."""
    import transfer_queue as tq
    from verl.utils import tensordict_utils as tu

    from recipe_apo.integration.multi_output import Sessions

    batch, n = prompts.source, len(prompts)
    copy = tu.index_select_tensor_dict(batch, torch.arange(n))
    probe_uids = [str(uuid.uuid4()) for _ in range(n)]
    tu.assign_non_tensor_stack(copy, "uid", probe_uids)
    tu.assign_non_tensor_stack(copy, "__rollout_n__", [samples] * n)
    route_sampling(copy, {"temperature": np.full(n, float(temperature))},
                   str(trainer.config.actor_rollout_ref.rollout.agent.default_agent_loop))
    step = global_steps(trainer)
    tu.assign_non_tensor_data(copy, "global_steps", step)
    tu.assign_non_tensor_data(copy, "validate", True)
    tags = [{"is_prompt": True, "status": "pending", "global_steps": step} for _ in range(n)]
    tq.kv_batch_put(keys=probe_uids, partition_id="val", tags=tags)
    trainer.agent_loop_manager.generate_sequences(copy)
    meta, _ = trainer.replay_buffer.sample(global_steps=step, partition_id="val", batch_size=n)
    try:
        if trainer.reward_loop_manager.reward_loop_worker_handles is None:
            trainer.checkpoint_manager.sleep_replicas()
            meta = trainer._compute_reward_colocate(meta)
            trainer.checkpoint_manager.update_weights()
        sessions = Sessions.of(meta.keys)
        finals = [key for key, final in zip(meta.keys, sessions.is_final) if final]
        data = tq.kv_batch_get(keys=finals, partition_id=meta.partition_id,
                               select_fields=["uid", "rm_scores", "responses", "response_mask"])
        tokens = int(tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id,
                                     select_fields=["response_mask"])["response_mask"].values().sum())
    finally:
        tq.kv_clear(keys=meta.keys, partition_id=meta.partition_id)
    scores = data["rm_scores"].to_padded_tensor(padding=0.0).sum(dim=-1).double().numpy()
    mask = data["response_mask"].to_padded_tensor(padding=0).bool()
    responses = data["responses"].to_padded_tensor(padding=0)
    texts = trainer.tokenizer.batch_decode([row[m].tolist() for row, m in zip(responses, mask)],
                                           skip_special_tokens=True)
    owner = {uid: j for j, uid in enumerate(probe_uids)}
    rows = np.array([owner[str(uid)] for uid in data["uid"]], dtype=np.int64)
    grouped, keys = by_prompt(rows, scores, [answer_key(text) for text in texts], n, samples)
    return Probe(grouped, keys, tokens)


def by_prompt(rows: np.ndarray, scores: np.ndarray, keys: list[str], n: int, samples: int):
    """(n, samples) rewards and n lists of keys from per-response arrays (each prompt's responses in their order);
    a prompt whose every response failed in verl's rollout is refused by name."""
    counts = np.bincount(rows, minlength=n)
    if (counts != samples).any():
        prompt = int(np.flatnonzero(counts != samples)[0])
        raise MethodStateError(f"the probe: prompt {prompt} of the step came back with {counts[prompt]} of "
                               f"{samples} responses")
    order = np.argsort(rows, kind="stable")
    grouped = scores[order].reshape(n, samples)
    key_rows = np.array(keys, dtype=object)[order].reshape(n, samples).tolist()
    return grouped, key_rows


# ---- the replay buffer's group filter -------------------------------------------------------------------------------
TRAIN = "train"  # verl's training partition; validation (and the probe) sample "val", which verl never filters
_TRAINER_LOGGER = "verl.trainer.ppo.v1.trainer_base"


def cap_refills(buffer: Any, cap: RefillCap) -> bool:
    """verl's replay buffer refills through ``cap`` (``recipe_apo.integration.refill_cap``), and stops the run where
    it would otherwise wait forever. False, and nothing changed, for a buffer without verl's group filter (a custom
    sampler, ``trainer.v1.sampler.custom_sampler``, which owns its filtering).

    verl exposes no hook at the point a cap needs, its polling loop, so the buffer object's own methods are
    wrapped: ``refill_fn`` (the trainer's ``_add_prompts_to_generate``, verl's one way to send refills) sends what
    ``cap.grant`` allows (verl counts what it asked for as sent, so a withheld request is not repeated forever);
    ``sample`` and ``wait_for_sampleable`` record how many groups the step waits for; ``_wait_for_next_poll``, the
    one place both polling loops reach when they can neither take a batch nor send a refill, runs ``cap.check``
    first. There, after the loop's eviction, the finished and failed groups left are exactly those it could
    sample, and the pending and running ones those in flight."""
    if getattr(buffer, "filter_groups_metric", None) is None or getattr(buffer, "refill_fn", None) is None \
            or not hasattr(buffer, "_wait_for_next_poll"):
        return False
    refill, sample, wait = buffer.refill_fn, buffer.sample, buffer._wait_for_next_poll

    def capped_refill(num_prompts: int) -> int:
        granted = cap.grant(num_prompts)
        return refill(granted) if granted else 0  # verl's dataloader refuses a request for 0 prompts

    def sample_counted(global_steps: int, partition_id: str, batch_size: int):
        if partition_id == TRAIN:
            cap.needed = int(batch_size)
        return sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)

    def wait_or_stop(partition_id: str, last_debug_time: float) -> float:
        if partition_id == TRAIN:
            sampleable = buffer.finished_keys[partition_id] | buffer.failure_keys[partition_id]
            cap.check(len(sampleable),
                      len(buffer.pending_keys[partition_id]) + len(buffer.running_keys[partition_id]))
        return wait(partition_id, last_debug_time)

    buffer.refill_fn, buffer.sample, buffer._wait_for_next_poll = capped_refill, sample_counted, wait_or_stop
    if hasattr(buffer, "wait_for_sampleable"):
        wait_for = buffer.wait_for_sampleable

        def wait_for_counted(global_steps: int, partition_id: str, target_count: int):
            if partition_id == TRAIN:
                cap.needed = int(target_count)
            return wait_for(global_steps, partition_id, target_count)

        buffer.wait_for_sampleable = wait_for_counted
    return True


class _IgnoredCapWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("algorithm.filter_groups.max_num_gen_batches=")
                    and "is ignored by the built-in V1 ReplayBuffer" in message)


@contextlib.contextmanager
def cap_warning_dropped() -> Iterator[None]:
    """While held, verl's warning that ``max_num_gen_batches`` is ignored is dropped (only it): the recipe's trainer
    honours the setting and says so itself."""
    logger, dropped = logging.getLogger(_TRAINER_LOGGER), _IgnoredCapWarning()
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)
