"""Paired training runs: per seed one pretrained "base model", prompt stream and evaluation set, shared by every
method; per (seed, method) one RL run in verl's loop (rollout, old log-probs, advantages, ``ppo_epochs`` of
mini-batch updates).

CoDaPO (``adv_estimator=codapo``) gets the old log-probs handed to its estimator, and with
``algorithm.codapo.resample`` its rounds go in pairs through the recipe's trainer's own pairing
(``recipe_apo.integration.resampling.StepPairing``): round r (even) takes the seed's prompt batch r, round r + 1
repeats the prompts of round r whose weight reaches the percentile (``repeat_count`` copies in place, each its
own group). It thus reads half the prompt stream in as many rounds.

Runs go to a process pool (one torch thread each: a GRU this small gains nothing from intra-op threads, and
with one thread the numbers are the same whichever worker runs a job). Each job depends only on its seed and
its config, so results do not depend on scheduling.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from recipe_apo.integration.resampling import StepPairing, first_of_pair
from recipe_apo.methods import driver_state
from recipe_apo.methods.codapo import CodapoSettings
from recipe_apo.methods.group_stats import length_by_outcome
from recipe_apo.methods.zero_variance import exclude_zero_variance, live_rows
from recipe_apo.testbed.agpo import AgpoRun, is_agpo
from recipe_apo.testbed.errors import TestbedSettingError
from recipe_apo.testbed.modsum import ModSumTask
from recipe_apo.testbed.policy import TokenPolicy, build_policy, pretrain
from recipe_apo.testbed.rollout import compute_advantages, rollout
from recipe_apo.testbed.settings import TASKS
from recipe_apo.testbed.task import ReverseTask, Task
from recipe_apo.testbed.update import actor_config, effective_agg_mode, ppo_update

BUCKETS = ("hard", "medium", "easy")

# Independent random streams of a seed; methods share all of them except what their own updates change. _PROBE:
# AGPO's probe (method=agpo_dual), apart so that its training samples read the stream the others read.
_PRETRAIN, _PROMPTS, _EVAL_SET, _SAMPLING, _EVAL_SAMPLING, _SHUFFLE, _PROBE = range(7)


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
    """Per-prompt success rate over ``samples`` sampled responses (temperature 1, the policy RL trains)."""
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
    driver_state.reset_driver_anchors()
    return {
        "label": label,
        "seed": setup.seed,
        "history": run.history,
        "evals": run.evals,
        "wall_s": time.perf_counter() - started,
    }


class MethodRun:
    """One (seed, method) run between its rounds: the trained policy, its optimizer and random streams, the
    sampling policy of a stale run, CoDaPO's pairing of rounds, and what the rounds recorded.

    A round is verl's step: its prompts (``round_prompts``), the rollout and the old log-probs
    (``sample_round``), the advantages (``advantages``: CoDaPO's hand-off, the zero-variance rescale), the
    update (``update.ppo_update``), then the round's metrics (``record_*``). Round r is verl's step r + 1, so
    CoDaPO's pairs are the trainer's (``recipe_apo.integration.resampling``): round r (even) takes the seed's
    prompt batch r, round r + 1 its kept prompts.
    """

    def __init__(self, cfg: DictConfig, setup: SeedSetup) -> None:
        self.cfg, self.setup = cfg, setup
        self.task = make_task(cfg)
        self.policy = self._build_policy()
        self.policy.load_state_dict(setup.init_state)
        self.group = group_size(cfg)
        self.actor = actor_config(cfg.actor_rollout_ref.actor, self.group)
        optim = cfg.actor_rollout_ref.actor.optim
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=optim.lr, betas=tuple(optim.betas),
                                           weight_decay=optim.weight_decay)
        self.estimator = cfg.algorithm.adv_estimator
        settings = CodapoSettings.from_algorithm_config(cfg.algorithm) if self.estimator == "codapo" else None
        # CoDaPO's rounds in pairs, as the trainer's steps (None: every round reads the prompt stream).
        self.pairing = StepPairing(settings) if settings is not None and settings.resample else None
        self.kept: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # the pair's kept prompts and their k
        self.zero_variance = cfg.algorithm.get("zero_variance", "keep")
        driver_state.reset_driver_anchors()
        self.sampling, self.shuffling = generator(setup.seed, _SAMPLING), generator(setup.seed, _SHUFFLE)
        # AGPO's controllers, fresh for the run (method=agpo_dual), and the old policy's token entropies of the
        # round's responses that its clips read.
        self.agpo = AgpoRun(cfg, generator(setup.seed, _PROBE)) if is_agpo(cfg) else None
        self.old_entropy: Optional[torch.Tensor] = None
        # The reference policy of verl's KL loss (use_kl_loss): the run's initial policy.
        self.reference: Optional[TokenPolicy] = None
        if self.actor.use_kl_loss:
            self.reference = self._build_policy()
            self.reference.load_state_dict(setup.init_state)
        self.staleness = int(cfg.get("staleness", 0))  # checked by runner.check_method
        # The sampling policy of a stale run: the trained policy's weights of `staleness` rounds ago.
        self.behaviour = self._build_policy() if self.staleness else None
        self.past: deque = deque(maxlen=self.staleness + 1)
        self.history: dict[str, list[float]] = {}
        self.evals: dict[str, list[float]] = {"round": [], "overall": [], **{b: [] for b in BUCKETS}}

    def _build_policy(self) -> TokenPolicy:
        cfg = self.cfg
        return build_policy(self.task, cfg.policy.embed_dim, cfg.policy.hidden_dim, cfg.policy.layers,
                            self.setup.seed)

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
        prompts, k, second = self.round_prompts(r + 1)
        batch, old_log_prob = self.sample_round(prompts, k)
        advantages, live = self.advantages(batch, old_log_prob)
        clip_eps = self.agpo.clips(batch, self.old_entropy, self.group) if self.agpo is not None else None
        ref_log_prob = None
        if self.reference is not None:
            with torch.no_grad():
                ref_log_prob = self.reference.log_probs(batch["prompts"], batch["responses"])
        if on_round is not None:
            on_round(r, batch, old_log_prob, advantages)
        metrics = ppo_update(self.policy, self.optimizer, self.actor, batch, advantages, old_log_prob,
                             self.shuffling, zero_variance=self.zero_variance, live=live, clip_eps=clip_eps,
                             ref_log_prob=ref_log_prob)
        # Share of the round's responses in groups with a signal (two distinct rewards or more).
        self.record("live_share", live.mean())
        # Tokens generated in the round: its training responses' and, for AGPO, its probe's (scored, then
        # dropped); each response counts its tokens up to and including the end token.
        train_tokens = float(batch["response_mask"].sum())
        probe_tokens = self.agpo.metrics["probe_tokens"] if self.agpo is not None else 0.0
        self.record("train_tokens", train_tokens)
        self.record("probe_tokens", probe_tokens)
        self.record("tokens_generated", train_tokens + probe_tokens)
        if self.agpo is not None:
            self.agpo.after_update(self.policy, batch, old_log_prob)
            for key, value in self.agpo.metrics.items():
                if key != "probe_tokens":
                    self.record(key, value)
        if self.estimator == "codapo":
            self.record_codapo(r + 1, batch, prompts, k, second)
        self.record_batch(batch, metrics)
        if self.estimator == "apo":
            self.record_anchor()

    def round_prompts(self, step: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Step ``step``'s prompts and their k, and whether they are the second step of a CoDaPO pair (the kept
        prompts of the step before, ``repeat_count`` copies in place)."""
        if self.pairing is not None and not first_of_pair(step):
            order = torch.from_numpy(self.pairing.second_order(self.cfg.data.train_batch_size, step))
            return self.kept[0][order], self.kept[1][order], True
        if self.pairing is not None:
            self.pairing.start(step)
        return self.setup.train_prompts[step - 1], self.setup.train_k[step - 1], False

    def sampler(self) -> TokenPolicy:
        """The policy that samples this round: the trained one, or in a stale run its weights after round
        r - staleness (the start, in the first rounds)."""
        if not self.staleness:
            return self.policy
        self.past.append({name: t.detach().clone() for name, t in self.policy.state_dict().items()})
        self.behaviour.load_state_dict(self.past[0])
        return self.behaviour

    def sample_round(self, prompts: torch.Tensor, k: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
        """The round's responses and their old log-probs, before the advantages, as verl's trainer takes them:
        CoDaPO's weight reads them. No gradient, same weights: the order changes no number of the others.
        AGPO (``recipe_apo.testbed.agpo``): its probe first, the responses of each prompt at its tau_t, and the
        old policy's token entropies kept for its clips."""
        sampler = self.sampler()
        # AGPO: the probe first, then each prompt's training responses at its tau_t.
        temperature = self.agpo.probe(sampler, self.task, prompts, k) if self.agpo is not None else None
        batch = rollout(sampler, self.task, prompts, k, self.group, self.sampling, temperature)
        with torch.no_grad():
            if self.agpo is not None:
                old_log_prob, self.old_entropy = sampler.log_probs_and_entropy(batch["prompts"], batch["responses"])
            else:
                old_log_prob = sampler.log_probs(batch["prompts"], batch["responses"])
            if self.staleness:
                # Where the ratio pi / pi_old starts: mean |r - 1| over the round's valid tokens.
                mask = batch["response_mask"].to(torch.bool)
                current = self.policy.log_probs(batch["prompts"], batch["responses"])
                self.record("ratio_dev_mean", (current - old_log_prob).exp().sub(1).abs()[mask].mean())
        return batch, old_log_prob

    def advantages(self, batch: dict[str, Any], old_log_prob: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
        """verl's advantages of the round, and per response whether its group is live.

        CoDaPO's estimator gets the old log-probs through ``driver_state.handed`` and
        ``algorithm.zero_variance=exclude`` rescales through ``exclude_zero_variance``: what the trainer's
        hooks (recipe_apo/integration/hooks/) call at the same point of a step."""
        driver_state.clear_results("codapo")
        with driver_state.handed(old_log_probs=old_log_prob):  # read by codapo only
            advantages = compute_advantages(batch, self.cfg.algorithm)
        scores = batch["token_level_rewards"].sum(dim=-1).double().numpy()
        live = live_rows(scores, batch["response_mask"].sum(dim=-1).numpy() > 0, batch["uid"])
        if self.zero_variance == "exclude":
            advantages, zv_metrics = exclude_zero_variance(
                advantages, batch["token_level_rewards"], batch["response_mask"], batch["uid"],
                effective_agg_mode(self.actor),
            )
            self.record("zv_scale", zv_metrics["zero_variance/scale"])
        return advantages, live

    def record_codapo(self, step: int, batch: dict[str, Any], prompts: torch.Tensor, k: torch.Tensor,
                      second: bool) -> None:
        """CoDaPO's weights of the round and, at the first step of a pair, the prompts it keeps."""
        result = driver_state.last_result("codapo")
        for key in ("weight_mean", "confidence_mean", "difficulty_weight_mean"):
            self.record(f"codapo_{key}", result.metrics.get(f"codapo/{key}", float("nan")))
        self.record("resampled", float(second))
        if self.pairing is None or not first_of_pair(step):
            self.record("kept_prompts", float("nan"))
            return
        self.pairing.add_weights(result.per_response["uids"], result.per_response["weights"])
        kept = torch.from_numpy(self.pairing.select(batch["uid"][:: self.group]))
        self.kept = (prompts[kept], k[kept])
        self.record("kept_prompts", len(kept))

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

    def record_anchor(self) -> None:
        """The APO estimator's anchor metrics of the round."""
        result = driver_state.last_result("apo")
        anchor_metrics = {} if result is None else result.metrics
        self.record("anchor", anchor_metrics.get("apo/anchor", float("nan")))
        rate = anchor_metrics.get("apo/anchor_rate", float("nan"))
        self.record("anchor_rate", rate)
        # eta_t = clip(eta std(H), eta_min, 1) at its floor: the anchor then moves as a plain exponential average
        # and eta does nothing (docs/internals.md, "The anchor's rate").
        at_floor = rate == float(self.cfg.algorithm.apo.eta_min) if math.isfinite(rate) else float("nan")
        self.record("anchor_rate_at_floor", float(at_floor))
        self.record("weight_pos_mean", anchor_metrics.get("apo/weight_pos_mean", float("nan")))
        self.record("weight_neg_mean", anchor_metrics.get("apo/weight_neg_mean", float("nan")))


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

    first = next(iter(method_cfgs.values()))
    plain = {label: OmegaConf.to_container(cfg, resolve=True) for label, cfg in method_cfgs.items()}
    base_plain = OmegaConf.to_container(first, resolve=True)
    total = len(seeds) + sum(cfg.rounds for cfg in method_cfgs.values()) * len(seeds)
    bar = tqdm(total=total, desc=desc, unit="round", disable=not show_progress, file=sys.stderr)

    if workers <= 1:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            setups = {}
            for seed in seeds:
                setups[seed] = prepare_seed(first, seed)
                bar.update(1)
            runs = [
                run_method(method_cfgs[label], label, setups[seed], bar.update)
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
