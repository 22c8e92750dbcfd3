"""Paired training runs: per seed one pretrained "base model", prompt stream and evaluation set, shared by every
method; per (seed, method) one RL run in verl's loop (rollout, old log-probs, advantages, ``ppo_epochs`` of
mini-batch updates).

CoDaPO (``adv_estimator=codapo``) gets the old log-probs handed to its estimator, and with
``algorithm.codapo.resample`` its rounds go in pairs as in the recipe's trainer: round r (even) takes the seed's
prompt batch r, round r + 1 repeats the prompts of round r whose weight reaches the percentile
(``repeat_count`` copies in place, each its own group). It thus reads half the prompt stream in as many rounds.

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

from recipe_apo.methods import driver_state
from recipe_apo.methods.codapo import CodapoSettings, resample_order, select_prompts
from recipe_apo.methods.group_stats import length_by_outcome
from recipe_apo.methods.zero_variance import exclude_zero_variance, live_rows
from recipe_apo.testbed.modsum import ModSumTask
from recipe_apo.testbed.policy import TokenPolicy, build_policy, pretrain
from recipe_apo.testbed.rollout import compute_advantages, rollout
from recipe_apo.testbed.task import ReverseTask, Task
from recipe_apo.testbed.update import actor_config, effective_agg_mode, ppo_update

BUCKETS = ("hard", "medium", "easy")

# Independent random streams of a seed; methods share all of them except what their own updates change.
_PRETRAIN, _PROMPTS, _EVAL_SET, _SAMPLING, _EVAL_SAMPLING, _SHUFFLE = range(6)


def generator(seed: int, stream: int, step: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(1_000_003 * seed + 7919 * stream + step)


TASKS = ("reverse", "modsum")


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
            raise ValueError(f"task.moduli must be a list of whole numbers >= 2, e.g. [2,4,8], got {cfg.task.moduli!r}")
        return ModSumTask(
            moduli=tuple(cfg.task.moduli),
            max_response_length=cfg.data.max_response_length,
            filler_mean=cfg.task.filler_mean,
            prefix_max=cfg.task.prefix_max,
        )
    raise ValueError(f"task.name must be one of {', '.join(TASKS)} (task=reverse|modsum), got {name!r}")


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
    seed = setup.seed
    task = make_task(cfg)
    policy = build_policy(task, cfg.policy.embed_dim, cfg.policy.hidden_dim, cfg.policy.layers, seed)
    policy.load_state_dict(setup.init_state)
    actor = actor_config(cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n)
    optim = cfg.actor_rollout_ref.actor.optim
    optimizer = torch.optim.AdamW(policy.parameters(), lr=optim.lr, betas=tuple(optim.betas),
                                  weight_decay=optim.weight_decay)
    uses_anchor = cfg.algorithm.adv_estimator == "apo"
    codapo = cfg.algorithm.adv_estimator == "codapo"
    codapo_settings = CodapoSettings.from_algorithm_config(cfg.algorithm) if codapo else None
    resample = codapo and codapo_settings.resample
    zero_variance = cfg.algorithm.get("zero_variance", "keep")
    driver_state.reset_driver_anchors()
    sampling, shuffling = generator(seed, _SAMPLING), generator(seed, _SHUFFLE)
    group = cfg.actor_rollout_ref.rollout.n
    staleness = int(cfg.get("staleness", 0))  # checked by check_method
    # The sampling policy of a stale run: the trained policy's weights of `staleness` rounds ago.
    behaviour, past = None, deque(maxlen=staleness + 1)
    if staleness:
        behaviour = build_policy(task, cfg.policy.embed_dim, cfg.policy.hidden_dim, cfg.policy.layers, seed)

    history: dict[str, list[float]] = {}
    evals: dict[str, list[float]] = {"round": [], "overall": [], **{b: [] for b in BUCKETS}}

    def record(key: str, value: float) -> None:
        history.setdefault(key, []).append(float(value))

    def run_eval(round_index: int) -> None:
        success = evaluate(policy, task, setup.eval_prompts, setup.eval_k, cfg.eval.samples,
                           generator(seed, _EVAL_SAMPLING, round_index))
        evals["round"].append(round_index)
        evals["overall"].append(float(success.mean()))
        for b, name in enumerate(BUCKETS):
            evals[name].append(float(success[setup.bucket == b].mean()))

    run_eval(0)
    kept = previous = None
    for r in range(cfg.rounds):
        second = resample and r % 2 == 1
        if second:
            # The second round of a pair: the first round's kept prompts, repeat_count copies in place.
            order = torch.from_numpy(resample_order(kept, cfg.data.train_batch_size, codapo_settings.repeat_count))
            prompts, k = previous[0][order], previous[1][order]
        else:
            prompts, k = setup.train_prompts[r], setup.train_k[r]
        sampler = policy
        if staleness:
            past.append({name: t.detach().clone() for name, t in policy.state_dict().items()})
            behaviour.load_state_dict(past[0])  # after round r - staleness (the start, in the first rounds)
            sampler = behaviour
        batch = rollout(sampler, task, prompts, k, group, sampling)
        # Before the advantages, as verl's trainer does: CoDaPO's weight reads them. No gradient, same weights:
        # the order changes no number of the other methods.
        with torch.no_grad():
            old_log_prob = sampler.log_probs(batch["prompts"], batch["responses"])
            if staleness:
                # Where the ratio pi / pi_old starts: mean |r - 1| over the round's valid tokens.
                mask = batch["response_mask"].to(torch.bool)
                current = policy.log_probs(batch["prompts"], batch["responses"])
                record("ratio_dev_mean", (current - old_log_prob).exp().sub(1).abs()[mask].mean())
        if codapo:
            with driver_state.handed(old_log_probs=old_log_prob):
                advantages = compute_advantages(batch, cfg.algorithm)
        else:
            advantages = compute_advantages(batch, cfg.algorithm)
        scores = batch["token_level_rewards"].sum(dim=-1).double().numpy()
        live = live_rows(scores, batch["response_mask"].sum(dim=-1).numpy() > 0, batch["uid"])
        if zero_variance == "exclude":
            advantages, zv_metrics = exclude_zero_variance(
                advantages, batch["token_level_rewards"], batch["response_mask"], batch["uid"],
                effective_agg_mode(actor),
            )
            record("zv_scale", zv_metrics["zero_variance/scale"])
        if on_round is not None:
            on_round(r, batch, old_log_prob, advantages)
        metrics = ppo_update(policy, optimizer, actor, batch, advantages, old_log_prob, shuffling,
                             zero_variance=zero_variance, live=live)
        # Share of the round's responses in groups with a signal (two distinct rewards or more).
        record("live_share", live.mean())
        if codapo:
            result = driver_state.last_result("codapo")
            for key in ("weight_mean", "confidence_mean", "difficulty_weight_mean"):
                record(f"codapo_{key}", result.metrics.get(f"codapo/{key}", float("nan")))
            record("resampled", float(second))
            if resample and not second:
                prompt_uids = batch["uid"][::group]
                kept = select_prompts(prompt_uids, result.per_response["uids"], result.per_response["weights"],
                                      codapo_settings.percentile)
                previous = (prompts, k)
                record("kept_prompts", len(kept))
            else:
                record("kept_prompts", float("nan"))

        correct = batch["reward"] > 0.5
        record("batch_success", batch["reward"].mean())
        length_correct, length_incorrect = length_by_outcome(batch["length"].numpy(), correct.numpy())
        record("len_correct", length_correct)
        record("len_incorrect", length_incorrect)
        # Fillers, not raw length, are what the policy chooses: a correct answer to a longer string is longer.
        fillers_correct, fillers_incorrect = length_by_outcome(batch["fillers"].numpy(), correct.numpy())
        record("fillers_correct", fillers_correct)
        record("fillers_incorrect", fillers_incorrect)
        record("cut_share", batch["cut"].float().mean())
        for key, value in metrics.items():
            record(key, value)
        if uses_anchor:
            anchor_metrics = _anchor_metrics()
            record("anchor", anchor_metrics.get("apo/anchor", float("nan")))
            record("anchor_rate", anchor_metrics.get("apo/anchor_rate", float("nan")))
            record("weight_pos_mean", anchor_metrics.get("apo/weight_pos_mean", float("nan")))
            record("weight_neg_mean", anchor_metrics.get("apo/weight_neg_mean", float("nan")))
        if (r + 1) % cfg.eval_every == 0 or r + 1 == cfg.rounds:
            run_eval(r + 1)
        if progress is not None:
            progress(1)
    driver_state.reset_driver_anchors()
    return {
        "label": label,
        "seed": seed,
        "history": history,
        "evals": evals,
        "wall_s": time.perf_counter() - started,
    }


def _anchor_metrics() -> dict[str, float]:
    """The APO estimator's metrics of the last step."""
    result = driver_state.last_result("apo")
    return {} if result is None else result.metrics


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
