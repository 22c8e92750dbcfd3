"""Paired training runs: per seed one pretrained "base model", prompt stream and evaluation set, shared by every
method; per (seed, method) one RL run in verl's loop (rollout, old log-probs, advantages, ``ppo_epochs`` of
mini-batch updates).

The methods' step logic is their runtimes' (``recipe_apo.methods.<method>.runtime``), driven here as verl's
trainer drives them (``recipe_apo.integration.trainer``); this module is the testbed's adapter and names no method.
CoDaPO's pairs, for instance, are its runtime's: round r (verl's step r + 1, odd) takes the seed's prompt batch r,
the round after it the kept prompts, so it reads half the prompt stream.

Runs go to a process pool (one torch thread each: a GRU this small gains nothing from intra-op threads, and
with one thread the numbers are the same whichever worker runs a job). Each job depends only on its seed and
its config, so results do not depend on scheduling.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from recipe_apo.methods import catalog, handoff
from recipe_apo.methods.base import BASE_HEAD, ActorCall, Probe, Prompts, StepBatch, Trajectories, load
from recipe_apo.methods.group_stats import length_by_outcome, live_rows
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.modsum import ModSumTask
from recipe_apo.testbed.policy import TokenPolicy, build_policy, pretrain
from recipe_apo.testbed.rollout import compute_advantages, rollout
from recipe_apo.testbed.settings import TASKS
from recipe_apo.testbed.task import ReverseTask, Task
from recipe_apo.testbed.update import actor_config, ppo_update

BUCKETS = ("hard", "medium", "easy")

# Independent random streams of a seed; methods share all of them except what their own updates change. _PROBE:
# a runtime's probe (``TestbedHost.probe``), apart so that its training samples read the stream the others read;
# _REFILL: the prompts and samples of the group filter's refills (``MethodRun.filter_groups``), apart likewise;
# _RESIDUAL: the draw of a residual logits head (``MethodRun._build_policy``).
_PRETRAIN, _PROMPTS, _EVAL_SET, _SAMPLING, _EVAL_SAMPLING, _SHUFFLE, _PROBE, _REFILL, _RESIDUAL = range(9)


def generator(seed: int, stream: int, step: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(1_000_003 * seed + 7919 * stream + step)




def group_size(cfg: DictConfig) -> int:
    """A method's responses per prompt: ``actor_rollout_ref.rollout.n`` x its ``rollout_n_multiplier``."""
    return int(cfg.actor_rollout_ref.rollout.n) * int(cfg.get("rollout_n_multiplier", 1))


def make_task(cfg: DictConfig) -> Task:
    """The task of ``cfg.task`` (conf/task/<name>.yaml)."""
    name = cfg.task.get("name", "reverse")
    if name == "reverse":
        return ReverseTask(
            alphabet=cfg.task.alphabet,
            min_len=cfg.task.min_len,
            max_len=cfg.task.max_len,
            max_response_length=cfg.data.max_response_length,
            filler_mean=cfg.task.filler_mean,
        )
    if name == "modsum":
        if not OmegaConf.is_list(cfg.task.moduli):
            raise TestbedSettingError(f"task.moduli={cfg.task.moduli!r}: a list of whole numbers >= 2, e.g. [2,4,8]")
        return ModSumTask(
            moduli=tuple(cfg.task.moduli),
            max_response_length=cfg.data.max_response_length,
            filler_mean=cfg.task.filler_mean,
            prefix_max=cfg.task.prefix_max,
        )
    raise TestbedSettingError(f"task.name={name}: one of {', '.join(TASKS)} (task=reverse|modsum)")


@dataclass
class SeedSetup:
    """What every method of one seed shares: initial weights, prompts, evaluation set and its buckets."""

    seed: int
    init_state: dict[str, torch.Tensor]
    init_digest: str
    train_prompts: torch.Tensor  # [rounds, P, prompt_width]
    train_k: torch.Tensor  # [rounds, P]
    eval_prompts: torch.Tensor
    eval_k: torch.Tensor
    initial_success: torch.Tensor  # per eval prompt, from cfg.eval.bucket_samples samples
    bucket: torch.Tensor  # per eval prompt: 0 hard, 1 medium, 2 easy
    pretrain_loss: float


def evaluate(policy: TokenPolicy, task: Task, prompts, k, samples: int, gen) -> torch.Tensor:
    """Per-prompt success rate over ``samples`` sampled responses (temperature 1, the policy RL trains; its base
    head, the model a user keeps, where a method gave it a residual one)."""
    with policy.select_logits_head(BASE_HEAD):
        responses = policy.sample(prompts.repeat_interleave(samples, 0), task.max_response_length, gen)
    reward = task.score(prompts.repeat_interleave(samples, 0), k.repeat_interleave(samples, 0), responses)["reward"]
    return reward.view(-1, samples).mean(dim=1)


def state_digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def prepare_seed(cfg: DictConfig, seed: int) -> SeedSetup:
    task = make_task(cfg)
    policy = build_policy(task, cfg.policy.embed_dim, cfg.policy.hidden_dim, cfg.policy.layers, seed)
    losses = pretrain(policy, task, cfg.pretrain.steps, cfg.pretrain.batch_size, cfg.pretrain.lr,
                      generator(seed, _PRETRAIN))
    prompt_gen = generator(seed, _PROMPTS)
    rounds, per_round = cfg.rounds, cfg.data.train_batch_size
    prompts, k = task.sample_prompts(rounds * per_round, prompt_gen)
    eval_prompts, eval_k = task.stratified_prompts(cfg.eval.prompts_per_length, generator(seed, _EVAL_SET))
    initial = evaluate(policy, task, eval_prompts, eval_k, cfg.eval.bucket_samples,
                       generator(seed, _EVAL_SAMPLING, 10**6))
    # Tertiles of the initial policy's own success rates; ties (many zeros) are broken by string length.
    order = np.lexsort((-eval_k.numpy(), initial.numpy()))
    bucket = torch.empty(len(order), dtype=torch.int64)
    for b, part in enumerate(np.array_split(order, len(BUCKETS))):
        bucket[torch.from_numpy(part)] = b
    state = {name: t.detach().clone() for name, t in policy.state_dict().items()}
    return SeedSetup(
        seed=seed,
        init_state=state,
        init_digest=state_digest(state),
        train_prompts=prompts.view(rounds, per_round, -1),
        train_k=k.view(rounds, per_round),
        eval_prompts=eval_prompts,
        eval_k=eval_k,
        initial_success=initial,
        bucket=bucket,
        pretrain_loss=float(np.mean(losses[-20:])) if losses else float("nan"),
    )


def run_method(
    cfg: DictConfig,
    label: str,
    setup: SeedSetup,
    progress: Optional[Callable[[int], None]] = None,
    on_round: Optional[Callable[..., None]] = None,
) -> dict[str, Any]:
    """One RL run of one method from the seed's shared start. Returns its per-round history and evals.

    ``on_round(r, batch, old_log_prob, advantages)``, when given, sees every round's data (tests use it).
    """
    started = time.perf_counter()
    run = MethodRun(cfg, setup)
    run.evaluate(0)
    for r in range(cfg.rounds):
        run.train_round(r, on_round)
        if (r + 1) % cfg.eval_every == 0 or r + 1 == cfg.rounds:
            run.evaluate(r + 1)
        if progress is not None:
            progress(1)
    return {
        "label": label,
        "seed": setup.seed,
        "history": run.history,
        "evals": run.evals,
        "wall_s": time.perf_counter() - started,
    }


class TestbedHost:
    """What a method's runtime asks of the testbed (``recipe_apo.methods.base.Host``): a probe of the round's
    prompts by the policy that samples the round, on a random stream of its own (so the training samples read the
    stream every method of a seed reads), scored by the task, the task's own answers as the answer keys; and the
    updated policy's log-probs of the round's responses."""

    def __init__(self, run: "MethodRun", probe_generator: torch.Generator) -> None:
        self.run, self.generator = run, probe_generator
        self.sampler: Optional[TokenPolicy] = None
        self.batch: Optional[dict[str, Any]] = None
        self.probe_tokens = 0.0
        # The group filter's left-out groups' tokens (``MethodRun.filter_groups``).
        self.dropped_tokens = 0.0

    def probe(self, prompts: Prompts, samples: int, temperature: float, answer_key: Any) -> Probe:
        task, n = self.run.task, len(prompts)
        base = torch.full((n,), float(temperature))
        probe = rollout(self.sampler, task, prompts.columns["prompts"], prompts.columns["k"], samples, self.generator,
                        base)
        rewards = probe["reward"].double().view(n, samples).numpy()
        keys = task.vote_key(probe["prompts"], probe["k"], probe["responses"])
        tokens = float(probe["response_mask"].sum())
        self.probe_tokens += tokens
        return Probe(rewards, keys.reshape(n, samples).tolist(), int(tokens))

    def policy_log_probs(self) -> torch.Tensor:
        with torch.no_grad():
            return self.run.policy.log_probs(self.batch["prompts"], self.batch["responses"])


class MethodRun:
    """One (seed, method) run between its rounds: the trained policy, its optimizer and random streams, the
    sampling policy of a stale run, the active methods' runtimes, and what the rounds recorded.

    A round is verl's step r + 1, run as the recipe's trainer runs it (``recipe_apo.methods.base``): the runtimes'
    ``begin_step`` (and their estimators' states kept, ``recipe_apo.methods.handoff``); the round's prompts (a
    runtime's ``replace_prompts``, else the seed's prompt batch r) and every runtime's ``drew_prompts`` (with their
    per-prompt temperatures); the rollout and the old log-probs; verl's ``compute_advantage`` inside
    ``handoff.advantage_step`` (the runtimes' ``estimator_inputs`` handed, the estimators' results collected); their
    ``after_advantage`` (new advantages, loss columns); the update (``update.ppo_update``); ``after_update``;
    ``end_step``; then the round's record. Nothing here names a method: each active method's declared metrics
    (``<method>/<quantity>``) are recorded every round (NaN where a round has none).
    """

    def __init__(self, cfg: DictConfig, setup: SeedSetup) -> None:
        self.cfg, self.setup = cfg, setup
        self.task = make_task(cfg)
        self.methods = catalog.active(cfg)
        self.policy = self._build_policy(residual=True)
        self.group = group_size(cfg)
        self.actor = actor_config(cfg.actor_rollout_ref.actor, self.group)
        optim = cfg.actor_rollout_ref.actor.optim
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=optim.lr, betas=tuple(optim.betas),
                                           weight_decay=optim.weight_decay)
        self.sampling, self.shuffling = generator(setup.seed, _SAMPLING), generator(setup.seed, _SHUFFLE)
        self.runtimes = [r for r in (m.build_runtime(cfg) for m in self.methods) if r is not None]
        handoff.keep_estimator_states(self.runtimes)
        self.needs = frozenset().union(*(r.needs for r in self.runtimes))
        self.host = TestbedHost(self, generator(setup.seed, _PROBE))
        group_filter = cfg.algorithm.filter_groups
        self.refill_batches = int(group_filter.max_num_gen_batches) if group_filter.enable else 0
        self.refills = generator(setup.seed, _REFILL)
        # The reference policy of verl's KL loss (use_kl_loss): the run's initial policy.
        self.reference: Optional[TokenPolicy] = None
        if self.actor.use_kl_loss:
            self.reference = self._build_policy(residual=False)
        self.staleness = int(cfg.get("staleness", 0))  # checked by runner.check_method
        # The sampling policy of a stale run: the trained policy's weights of `staleness` rounds ago.
        self.behaviour = self._build_policy(residual=True) if self.staleness else None
        self.past: deque = deque(maxlen=self.staleness + 1)
        self.history: dict[str, list[float]] = {}
        self.evals: dict[str, list[float]] = {"round": [], "overall": [], **{b: [] for b in BUCKETS}}

    def _build_policy(self, residual: bool) -> TokenPolicy:
        """The seed's initial policy; with ``residual``, the residual logits head an active method's model has
        (``ModelParts.policy_head``), drawn from the seed's own stream."""
        cfg = self.cfg
        policy = build_policy(self.task, cfg.policy.embed_dim, cfg.policy.hidden_dim, cfg.policy.layers,
                              self.setup.seed)
        policy.load_state_dict(self.setup.init_state)
        heads = [m.models.policy_head for m in self.methods if m.models.policy_head] if residual else []
        if heads:
            policy.add_residual_head(load(heads[0])(cfg.policy.hidden_dim, self.task.vocab_size,
                                                    generator(self.setup.seed, _RESIDUAL)))
        return policy

    def actor_pass(self, step: int, call: str) -> tuple[str, bool]:
        """The runtimes' ``actor_call`` for a pass of the policy: (its logits head, restart the optimizer first)."""
        asked = ActorCall.of([r.actor_call(step, call) for r in self.runtimes]) or ActorCall()
        return asked.logits_head or self.policy.logits_head, asked.restart_optimizer

    def record(self, key: str, value: float) -> None:
        self.history.setdefault(key, []).append(float(value))

    def evaluate(self, round_index: int) -> None:
        """Success on the seed's evaluation set, overall and per bucket, after ``round_index`` rounds."""
        setup = self.setup
        success = evaluate(self.policy, self.task, setup.eval_prompts, setup.eval_k, self.cfg.eval.samples,
                           generator(setup.seed, _EVAL_SAMPLING, round_index))
        self.evals["round"].append(round_index)
        self.evals["overall"].append(float(success.mean()))
        for b, name in enumerate(BUCKETS):
            self.evals[name].append(float(success[setup.bucket == b].mean()))

    def train_round(self, r: int, on_round: Optional[Callable[..., None]] = None) -> None:
        step = r + 1
        for runtime in self.runtimes:
            runtime.begin_step(step)
        handoff.keep_estimator_states(self.runtimes)
        self.host.probe_tokens = self.host.dropped_tokens = 0.0
        prompts, k = self.round_prompts(step)
        batch, old_log_prob, entropy = self.sample_round(step, prompts, k)
        if self.refill_batches:
            batch, old_log_prob, entropy = self.filter_groups(step, batch, old_log_prob, entropy, prompts.shape[0])
        step_batch = StepBatch(uids=batch["uid"], token_level_scores=batch["token_level_rewards"],
                               response_mask=batch["response_mask"],
                               trajectories=Trajectories.single(len(batch["uid"])), old_log_probs=old_log_prob,
                               entropy=entropy)
        metrics, loss_columns = self.advantages(step, batch, step_batch)
        advantages = step_batch.advantages
        ref_log_prob = None
        if self.reference is not None:  # the initial policy, without a residual head: its base head
            with torch.no_grad():
                ref_log_prob = self.reference.log_probs(batch["prompts"], batch["responses"])
        if on_round is not None:
            on_round(r, batch, old_log_prob, advantages)
        head, restart = self.actor_pass(step, "update")
        if restart:
            self.optimizer.state.clear()  # Adam's moments and step count, as a fresh optimizer's
        with self.policy.select_logits_head(head):
            update = ppo_update(self.policy, self.optimizer, self.actor, batch, advantages, old_log_prob,
                                self.shuffling, runtimes=self.runtimes, loss_columns=loss_columns,
                                ref_log_prob=ref_log_prob)
        self.host.batch = batch
        for runtime in self.runtimes:
            runtime.after_update(step, step_batch, self.host)
        for runtime in self.runtimes:
            metrics.update(runtime.end_step(step))
        # Share of the round's responses in groups with a signal (two distinct rewards or more).
        scores = batch["token_level_rewards"].sum(dim=-1).double().numpy()
        self.record("live_share", live_rows(scores, batch["response_mask"].sum(dim=-1).numpy() > 0,
                                            batch["uid"]).mean())
        # Tokens generated in the round: its training responses', any probe's and the groups the group filter left
        # out (scored, then dropped); each response counts its tokens up to and including the end token.
        train_tokens = float(batch["response_mask"].sum())
        self.record("train_tokens", train_tokens)
        self.record("probe_tokens", self.host.probe_tokens)
        self.record("tokens_generated", train_tokens + self.host.probe_tokens + self.host.dropped_tokens)
        for method in self.methods:
            for quantity in method.metrics:
                name = method.metric(quantity)
                self.record(name, metrics.get(name, float("nan")))
        self.record_batch(batch, update)

    def round_prompts(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s prompts and their k: a runtime's (CoDaPO's kept prompts of the step before), else the
        seed's prompt batch ``step - 1``."""
        count = int(self.cfg.data.train_batch_size)
        for runtime in self.runtimes:
            table = runtime.replace_prompts(step, count)
            if table is not None:
                return table["prompts"], table["k"]
        return self.setup.train_prompts[step - 1], self.setup.train_k[step - 1]

    def sampler(self) -> TokenPolicy:
        """The policy that samples this round: the trained one, or in a stale run its weights after round
        r - staleness (the start, in the first rounds)."""
        if not self.staleness:
            return self.policy
        self.past.append({name: t.detach().clone() for name, t in self.policy.state_dict().items()})
        self.behaviour.load_state_dict(self.past[0])
        return self.behaviour

    def sample_round(self, step: int, prompts: torch.Tensor, k: torch.Tensor,
                     refill: bool = False) -> tuple[dict[str, Any], torch.Tensor, Optional[torch.Tensor]]:
        """The round's responses, their old log-probs and (when a runtime needs them) token entropies, before the
        advantages, as verl's trainer takes them. The runtimes see the drawn prompts first (AGPO's probe) and may
        set each prompt's sampling temperature. ``refill``: more prompts of the same round (the group filter's), by
        the round's sampling policy, on the refills' own random stream."""
        sampler = self.host.sampler if refill else self.sampler()
        self.host.sampler = sampler
        drawn = Prompts(uids=prompt_uids(prompts.shape[0]), columns={"prompts": prompts, "k": k})
        settings: dict[str, np.ndarray] = {}
        for runtime in self.runtimes:
            settings.update(runtime.drew_prompts(step, drawn, self.host))
        temperature = settings.get("temperature")
        if temperature is not None:
            temperature = torch.from_numpy(np.asarray(temperature)).to(torch.float32)
        batch = rollout(sampler, self.task, prompts, k, self.group, self.refills if refill else self.sampling,
                        temperature)
        entropy = None
        head, _ = self.actor_pass(step, "old_log_probs")
        with torch.no_grad(), sampler.select_logits_head(head):
            if "entropy" in self.needs:
                old_log_prob, entropy = sampler.log_probs_and_entropy(batch["prompts"], batch["responses"])
            else:
                old_log_prob = sampler.log_probs(batch["prompts"], batch["responses"])
            if self.staleness and not refill:
                # Where the ratio pi / pi_old starts: mean |r - 1| over the round's valid tokens.
                mask = batch["response_mask"].to(torch.bool)
                current = self.policy.log_probs(batch["prompts"], batch["responses"])
                self.record("ratio_dev_mean", (current - old_log_prob).exp().sub(1).abs()[mask].mean())
        return batch, old_log_prob, entropy

    def filter_groups(self, step: int, batch: dict[str, Any], old_log_prob: torch.Tensor,
                      entropy: Optional[torch.Tensor],
                      count: int) -> tuple[dict[str, Any], torch.Tensor, Optional[torch.Tensor]]:
        """verl's group filter (``algorithm.filter_groups.enable``, DAPO's dynamic sampling, AGPO's script): the
        round trains only on groups whose rewards differ, and refills with fresh prompts (``_REFILL``) until it
        has ``count`` groups or has generated ``max_num_gen_batches`` batches; it then trains on the first
        ``count`` groups with a signal, or on fewer, or, when no batch had one, on the last batch as it came (the
        recipe's trainer, at the same cap, stops the run: ``FilterGroups.max_num_gen_batches`` says why the testbed
        differs). Surplus groups are left out, as verl's sync trainer discards them. The tokens of the groups left
        out count in the round's generation."""
        parts, groups, batches, generated = [], 0, 0, 0.0
        while True:
            batches += 1
            tokens = batch["response_mask"].sum(dim=-1)
            generated += float(tokens.sum())
            scores = batch["token_level_rewards"].sum(dim=-1).double().numpy()
            live = np.flatnonzero(live_rows(scores, tokens.numpy() > 0, batch["uid"]))
            if live.size:
                batch["uid"] = np.array([f"{uid}.{batches}" for uid in batch["uid"]], dtype=object)
                parts.append(_rows((batch, old_log_prob, entropy), torch.from_numpy(live)))
                groups += len(live) // self.group
            if groups >= count or batches >= self.refill_batches:
                break
            prompts, k = self.task.sample_prompts(count, self.refills)
            batch, old_log_prob, entropy = self.sample_round(step, prompts, k, refill=True)
        if parts:
            merged = [_concat([part[i] for part in parts]) for i in range(3)]
            batch, old_log_prob, entropy = _rows(merged, torch.arange(min(groups, count) * self.group))
        self.record("filter_groups/gen_batches", batches)
        self.record("filter_groups/filled_share", min(groups, count) / count)
        self.host.dropped_tokens = generated - float(batch["response_mask"].sum())
        return batch, old_log_prob, entropy

    def advantages(self, step: int, batch: dict[str, Any],
                   step_batch: StepBatch) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """verl's advantages of the round, inside ``handoff.advantage_step``, then each runtime's
        ``after_advantage`` in catalog order: into ``step_batch.advantages``; returns the round's method metrics
        so far and the loss columns (one float32 value per response)."""
        with handoff.advantage_step(self.runtimes, step_batch):
            step_batch.advantages = compute_advantages(batch, self.cfg.algorithm)
        metrics, loss_columns = {}, {}
        for runtime in self.runtimes:
            out = runtime.after_advantage(step, step_batch)
            if out.advantages is not None:
                step_batch.advantages = out.advantages
            metrics.update(out.metrics)
            loss_columns.update({name: torch.from_numpy(np.asarray(values)).to(torch.float32)
                                 for name, values in out.loss_columns.items()})
        return metrics, loss_columns

    def record_batch(self, batch: dict[str, Any], metrics: dict[str, float]) -> None:
        """The round's success, lengths and cut share, then the update's metrics."""
        correct = batch["reward"] > 0.5
        self.record("batch_success", batch["reward"].mean())
        length_correct, length_incorrect = length_by_outcome(batch["length"].numpy(), correct.numpy())
        self.record("len_correct", length_correct)
        self.record("len_incorrect", length_incorrect)
        # Fillers, not raw length, are what the policy chooses: a correct answer to a longer string is longer.
        fillers_correct, fillers_incorrect = length_by_outcome(batch["fillers"].numpy(), correct.numpy())
        self.record("fillers_correct", fillers_correct)
        self.record("fillers_incorrect", fillers_incorrect)
        self.record("cut_share", batch["cut"].float().mean())
        for key, value in metrics.items():
            self.record(key, value)


def _rows(parts: Any, rows: torch.Tensor) -> tuple:
    """(batch, old log-probs, entropies) of ``rows`` only (a group's rows are adjacent: whole groups stay whole)."""
    batch, old_log_prob, entropy = parts
    taken = {key: value[rows.numpy()] if isinstance(value, np.ndarray) else value[rows] for key, value in batch.items()}
    return taken, old_log_prob[rows], None if entropy is None else entropy[rows]


def _concat(values: list) -> Any:
    """Per-row values of several batches, one after the other (a batch dict key by key)."""
    first = values[0]
    if first is None:
        return None
    if isinstance(first, dict):
        return {key: _concat([value[key] for value in values]) for key in first}
    if isinstance(first, np.ndarray):
        return np.concatenate(values)
    return torch.cat(values)


def prompt_uids(count: int) -> np.ndarray:
    """The uid of each of a round's prompts, as ``rollout`` gives its responses (``p<i>``)."""
    return np.array([f"p{i}" for i in range(count)], dtype=object)


# --- process pool plumbing ------------------------------------------------------------------------------

_queue = None


def _init_worker(queue, threads: int) -> None:
    global _queue
    _queue = queue
    torch.set_num_threads(threads)


def _report(n: int) -> None:
    if _queue is not None:
        _queue.put(n)


def _prepare_job(args):
    cfg_plain, seed = args
    return prepare_seed(OmegaConf.create(cfg_plain), seed)


def _run_job(args):
    cfg_plain, label, setup = args
    return run_method(OmegaConf.create(cfg_plain), label, setup, _report)


def run_all(
    method_cfgs: dict[str, DictConfig],
    seeds: list[int],
    workers: int,
    threads: int,
    show_progress: bool = True,
    desc: str = "testbed",
) -> tuple[dict[int, SeedSetup], list[dict[str, Any]]]:
    """Prepare each seed once, then run every (seed, method) pair; returns (setups, runs)."""
    from tqdm import tqdm

    from recipe_apo.testbed.setting_check import read_values

    # Each job gets what the testbed reads of its config (read_values), alike in this process and in the workers.
    plain = {label: read_values(cfg) for label, cfg in method_cfgs.items()}
    base_plain = next(iter(plain.values()))
    total = len(seeds) + sum(cfg["rounds"] for cfg in plain.values()) * len(seeds)
    bar = tqdm(total=total, desc=desc, unit="round", disable=not show_progress, file=sys.stderr)

    if workers <= 1:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            setups = {}
            for seed in seeds:
                setups[seed] = prepare_seed(OmegaConf.create(base_plain), seed)
                bar.update(1)
            runs = [
                run_method(OmegaConf.create(plain[label]), label, setups[seed], bar.update)
                for seed in seeds
                for label in method_cfgs
            ]
        finally:
            torch.set_num_threads(previous)
            bar.close()
        return setups, runs

    # fork: workers inherit the imported modules (importing verl costs seconds per process); the parent has
    # run no torch kernel yet, so no OpenMP pool is forked. macOS and Windows spawn.
    context = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    queue = context.Queue()
    with context.Pool(workers, initializer=_init_worker, initargs=(queue, threads)) as pool:
        pending = pool.map_async(_prepare_job, [(base_plain, seed) for seed in seeds])
        while not pending.ready():
            pending.wait(0.2)
        prepared = pending.get()
        bar.update(len(seeds))
        setups = {s.seed: s for s in prepared}
        jobs = [(plain[label], label, setups[seed]) for seed in seeds for label in method_cfgs]
        pending = pool.map_async(_run_job, jobs, chunksize=1)
        while not pending.ready():
            _drain(queue, bar, timeout=0.2)
        runs = pending.get()
        _drain(queue, bar, timeout=0.0)
    bar.close()
    return setups, runs


def _drain(queue, bar, timeout: float) -> None:
    import queue as queue_module

    try:
        bar.update(queue.get(timeout=timeout) if timeout else queue.get_nowait())
        while True:
            bar.update(queue.get_nowait())
    except queue_module.Empty:
        pass
