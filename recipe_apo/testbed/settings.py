"""Every setting of the testbed (``python -m recipe_apo.testbed``) that is its own, declared once: its default, what
it means, and the values it takes, as dataclass fields; and which of verl's keys it reads (``VERL_KEYS``).
``testbed.yaml`` composes verl's own ``ppo_trainer``, then these defaults (``configs.py`` stores them in Hydra's
ConfigStore as ``testbed_settings``, and each task's as an option of the ``task`` group), then its values for
verl's keys; ``setting_check`` checks a composed config against the same declarations before any work starts.

What a field takes follows from its annotation and its bounds (``setting(..., low=, high=)``): ``int`` a whole
number (``1.5``, ``true`` and ``'3'`` are refused), ``float`` a finite number, ``bool`` true or false, ``str``
a non-empty string or one of ``choices``, ``Optional[...]`` null too, ``list[int]`` a non-empty list of distinct
whole numbers, ``list[Override]`` Hydra overrides, ``list[Label]`` labels, ``dict[str, ...]`` label -> value.
``algorithm.<method>`` is each method's own settings class (``recipe_apo.methods.<method>.settings``).
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, dataclass, field
from typing import Any, NewType, Optional

from recipe_apo.methods.checks import AGG_MODES, L0_BOUNDS, TEMPERATURE_BOUNDS

MODES = ("train", "signal", "league")
TASKS = ("reverse", "modsum")
# algorithm.zero_variance in the testbed: the recipe's two, and the exact reference the recipe cannot run.
ZERO_VARIANCE_MODES = ("keep", "exclude", "exact")
# The per-run metrics of summary.json that the report pairs over seeds (report.PAIRED); league.metric is one.
PAIRED_METRICS = ("success_avg", "success_early", "success_final", "hard_success_avg", "hard_success_final",
                  "fillers_correct", "fillers_incorrect", "len_correct", "len_incorrect", "cut_share")
# torch.manual_seed and numpy's seeding take 0 .. 2^32 - 1 everywhere; the testbed's streams stay far inside
# torch's 64 bits (1_000_003 * seed + ...).
SEED_MAX = 2**32 - 1
# Nested or runtime-only fields of verl's actor config that the testbed does not take from its config
# (update.actor_config), and, beside them, what no command line sets (a class path, verl's rollout correction).
VERL_NOT_FROM_YAML = {"policy_loss", "optim", "checkpoint", "fsdp_config", "profiler", "engine", "model_config",
                      "qat", "global_batch_info", "strategy", "rollout_n", "router_replay", "megatron"}
VERL_NOT_SETTABLE = VERL_NOT_FROM_YAML | {"_target_", "rollout_correction"}

# A Hydra override (``task.max_len=6``) and a label (of ``methods``, a suffix of ``league.variants``).
Override = NewType("Override", str)
Label = NewType("Label", str)


def setting(default: Any = MISSING, **bounds: Any) -> Any:
    """A field with its default and what bounds its values: ``low``/``high`` (``low_open``/``high_open`` to leave
    an end out), ``choices``, ``example`` (shown when a value is refused), ``what`` (of a list of labels),
    ``distinct`` (a list of whole numbers; default true), ``fixed`` (the default
    is the only value: why). A dict's ``example`` is the mapping's; its entries take their kind's own."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=bounds)
    return field(default=default, metadata=bounds)


def _presets() -> list[str]:
    from recipe_apo.integration import presets

    return list(presets.names())


# --- the league ------------------------------------------------------------------------------------------------

@dataclass
class League:
    """mode=league: the methods named here (labels of ``methods``) and the league's own ``extra`` ones, each as it
    is and with its variants, paired over the seeds on each scenario; one report ranks every method against every
    other per scenario."""

    # Labels of `methods`, by default every preset's, e.g. league.methods=[grpo,codapo]; the first is the
    # reference of the plot (differences to it).
    methods: list[Label] = field(default_factory=_presets, metadata={"what": "labels of methods"})
    # label -> overrides: methods the league runs after league.methods, which the default train run does not.
    # apo_prior: APO with HA-DW's anchor order (docs/beside_apo.md); apo_one_sided: APO with its gate acting only
    # where r moved in the advantage's direction, as PPO's clip does (recipe_apo/methods/apo/loss.py).
    # grpo_2n, drgrpo_2n, apo_2n: the method with twice the scenario's responses per prompt
    # (rollout_n_multiplier=2), the generation of agpo_dual, whose probe of G = rollout.n samples per prompt
    # doubles a round's (results/league_agpo.md). Drop them with ~league.extra.
    extra: dict[str, list[Override]] = setting({
        "apo_prior": ["method=apo", "algorithm.apo.anchor_order=prior"],
        "apo_one_sided": ["method=apo", "actor_rollout_ref.actor.policy_loss.loss_mode=apo_one_sided"],
        "grpo_2n": ["method=grpo", "rollout_n_multiplier=2"],
        "drgrpo_2n": ["method=drgrpo", "rollout_n_multiplier=2"],
        "apo_2n": ["method=apo", "rollout_n_multiplier=2"],
    }, example="+league.extra.apo_x=[method=apo,algorithm.apo.eta=0.5]")
    # suffix -> overrides: a league method also runs with them, labelled <method>_<suffix>.
    variants: dict[str, list[Override]] = setting({"zv": ["algorithm.zero_variance=exclude"]},
                                                  example="league.variants.zv=[algorithm.zero_variance=exclude]")
    # suffix -> the league methods that run with that variant (a suffix not named here: every one;
    # ~league.variant_of gives every method every variant). By default the zero-variance denominator (AGPO's
    # loss-mask piece) on the baseline and on APO only. The league took about 45 minutes on 2 cores before
    # agpo_dual and the _2n entries,
    # which cost about twice a method each: drop what a run does not need, e.g.
    # 'league.methods=[grpo,drgrpo,apo,agpo_dual]' or ~league.extra.
    variant_of: dict[str, list[Label]] = setting({"zv": ["grpo", "apo"]},
                                                 example="league.variant_of.zv=[grpo,apo]")
    # Each scenario: overrides composed after the command line's; every method runs on each. Named by its
    # overrides (`scenario=X` by X; [] is "default"). Strings of at most 6 symbols (task.max_len=6) make the
    # hardest third learnable within the rounds; many_updates takes 16 optimizer steps per rollout; long_response
    # has answers of tens of tokens (GRPO's length bias); stale runs sample from the policy of 2 and 4 rounds
    # before; modsum is the task where hard prompts succeed by chance. Replace with e.g.
    # 'league.scenarios=[[],["task.max_len=3"]]'.
    scenarios: list[list[Override]] = setting(
        [[], ["task.max_len=6"], ["scenario=many_updates"], ["scenario=long_response"], ["scenario=stale"],
         ["scenario=stale", "staleness=4"], ["task=modsum"]],
        example="[[],[task.max_len=6],[scenario=stale]]")
    # What ranks the methods (a per-run key of summary.json): success on the evaluation set after the last round.
    metric: str = setting("success_final", choices=PAIRED_METRICS)
    # true: a league rerun into the folder of one that stopped part way (a session that ended, a killed job) keeps
    # each scenario that one finished with the same configs on the same kernels (its mark lists the configs, its
    # summary.json the kernels' fingerprint) and runs the rest; false: the earlier league's results go first. The
    # code is not compared: resume with the code that started the league.
    resume: bool = False


# --- the policy, its warm-up and its evaluation ------------------------------------------------------------------

@dataclass
class Policy:
    """The GRU language model."""

    # Token embedding width.
    embed_dim: int = setting(32, low=1, high=4096)
    # Hidden width.
    hidden_dim: int = setting(64, low=1, high=4096)
    # Number of GRU layers.
    layers: int = setting(1, low=1, high=16)


@dataclass
class Pretrain:
    """Supervised warm-up on demonstrations: the "base model". Few steps on purpose: short strings mostly solved,
    long ones rarely."""

    steps: int = setting(200, low=0, high=1_000_000)
    batch_size: int = setting(128, low=1, high=65_536)
    lr: float = setting(3.0e-3, low=0, high=10, low_open=True)


@dataclass
class Eval:
    # Evaluation prompts per string length (so every difficulty is covered alike).
    prompts_per_length: int = setting(24, low=1, high=10_000)
    # Sampled responses per evaluation prompt at each evaluation.
    samples: int = setting(4, low=1, high=10_000)
    # Samples per prompt for the initial success rates that define the difficulty buckets (thirds).
    bucket_samples: int = setting(16, low=1, high=10_000)


# --- verl's keys ----------------------------------------------------------------------------------------------
# The testbed's config is verl's own ppo_trainer, less what the testbed does not read: conf/testbed.yaml composes
# the keys below (and the actor fields passed on) at verl's values, then sets the testbed's, far from an LLM's.
# VERL_KEYS lists every key under verl's nodes that the testbed reads, with the values it can run; a key's type is
# verl's (the annotation in the dataclass its node's _target_ names, else the type of verl's default). Every other
# key of verl's keeps verl's value: changed, it is refused (the testbed would not honour it), except
# actor_rollout_ref.actor's scalar fields and .policy_loss's, which go on to verl's actor config
# (update.actor_config) for the registered losses to read (actor_rollout_ref.actor.kl_loss_coef=...).
# "ignored": taken, for verl's engines (a preset sets it), and why it changes nothing here.
_ONE_PROCESS = "the testbed's policy trains in one process without FSDP"
FSDP_STRATEGIES = ("fsdp", "fsdp2")
VERL_KEYS: dict[str, dict] = {
    # Prompts per round.
    "data.train_batch_size": dict(low=1, high=65_536),
    # L0: the response budget. A response that reaches it without the end token scores 0. The presets'
    # loss_scale_factor interpolates it.
    "data.max_response_length": dict(low=2, high=10_000),
    # Set by the method preset; any estimator registered in verl works (grpo, rloo, opo, grpo_passk, apo ...).
    "algorithm.adv_estimator": {},
    # verl's grpo: divide by the group's std (GRPO) or not (Dr. GRPO). Set by the preset.
    "algorithm.norm_adv_by_std_in_grpo": {},
    # Discount and GAE lambda, passed to compute_advantage as verl does (outcome estimators ignore them).
    "algorithm.gamma": dict(low=0, high=1),
    "algorithm.lam": dict(low=0, high=1),
    "algorithm.use_kl_in_reward": dict(fixed="the testbed has no KL penalty in the reward (its KL is the actor's "
                                             "KL loss, actor_rollout_ref.actor.use_kl_loss)"),
    # The recipe's own key (conf/apo_trainer.yaml): the zero-variance denominator, AGPO's loss-mask piece
    # (recipe_apo/methods/zero_variance/rescale.py), for any group estimator. A group whose responses all scored
    # alike has no signal (advantages 0) but counts in the loss's denominator. keep: it counts, as in verl.
    # exclude: it does not; the live responses' advantages are scaled by the round's B / B_live (T / T_live for
    # token-mean), what the recipe can do in verl, exact when a round is one mini-batch (the testbed records how
    # far off each mini-batch is: zv_ratio_dev_*). exact: testbed only (the recipe refuses it): each
    # mini-batch's denominator counts its own live responses (tokens), the definition.
    "algorithm.zero_variance": dict(choices=ZERO_VARIANCE_MODES),
    # verl's group filter (DAPO's dynamic sampling; method=agpo's preset turns it on): a round trains only on
    # groups whose rewards differ (the reward: verl's canonical pre-KL score, the testbed's only), refilled with
    # fresh prompts, taking at most max_num_gen_batches generation batches (the round's own included). The cap
    # is the recipe's trainer's (recipe_apo/integration/refill_cap.py), but what happens at it differs on
    # purpose: there, as in the authors' code, the run stops with one line; here the round trains on the groups
    # with a signal it has (or, if none, on its last batch as it came) and the run goes on, so that one hard
    # round does not end a league's seed (filter_groups/filled_share < 1 marks such rounds). verl's "0, no cap"
    # is refused: a solved task would refill forever.
    "algorithm.filter_groups.enable": {},
    "algorithm.filter_groups.metric": dict(choices=("reward",), type=str),
    "algorithm.filter_groups.max_num_gen_batches": dict(low=1, high=1000),
    # G, responses per prompt.
    "actor_rollout_ref.rollout.n": dict(low=2, high=1024),
    # The sampling temperature: 1.0, the policy the log-probs are of (unscaled). method=agpo_dual sets it to
    # algorithm.agpo_dual.base_temperature, its probe's; its training samples are drawn at each prompt's tau_t,
    # and its log-probs stay unscaled, as AGPO's source takes them.
    "actor_rollout_ref.rollout.temperature": dict(low=0, high=100, low_open=True),
    "actor_rollout_ref.rollout.calculate_log_probs": dict(
        ignored="the testbed samples with the policy itself: no engine log-probs to compare"),
    "actor_rollout_ref.model.external_lib": dict(
        choices=("recipe_apo.integration.model_classes",), type=Optional[str],
        ignored="the testbed's policy is its own, and gains a method's residual head from the method"),
    "actor_rollout_ref.actor.strategy": dict(choices=FSDP_STRATEGIES, ignored=_ONE_PROCESS),
    "actor_rollout_ref.actor.fsdp_config.strategy": dict(choices=FSDP_STRATEGIES, ignored=_ONE_PROCESS),
    "actor_rollout_ref.ref.strategy": dict(choices=FSDP_STRATEGIES, ignored=_ONE_PROCESS),
    "actor_rollout_ref.ref.fsdp_config.strategy": dict(choices=FSDP_STRATEGIES, ignored=_ONE_PROCESS),
    # Prompts per mini-batch (verl's unit); data.train_batch_size / this = optimizer steps per epoch.
    "actor_rollout_ref.actor.ppo_mini_batch_size": dict(low=1, high=65_536),
    # Responses per forward/backward; the loss of a mini-batch does not depend on it (global_batch_info).
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": dict(low=1, high=10_000_000),
    # Passes over each round's responses (E in the paper); more passes = more off-policy updates.
    "actor_rollout_ref.actor.ppo_epochs": dict(low=1, high=1000),
    "actor_rollout_ref.actor.shuffle": {},
    # The gradient-norm clip of verl's FSDP actor; the norm before clipping is recorded.
    "actor_rollout_ref.actor.grad_clip": dict(low=0, high=1e9, low_open=True),
    # AdamW, as verl's actor; the testbed's learning rate is far above an LLM's.
    "actor_rollout_ref.actor.optim.lr": dict(low=0, high=10),
    "actor_rollout_ref.actor.optim.betas": dict(low=0, high=1, high_open=True, example="[0.9,0.999]"),
    "actor_rollout_ref.actor.optim.weight_decay": dict(low=0, high=100),
    # Any registered loss: vanilla, apo, sapo, gspo, cispo, geo_mean, ...
    "actor_rollout_ref.actor.policy_loss.loss_mode": {},
    # seq-mean-token-mean (GRPO's 1/|o_i|), seq-mean-token-sum-norm (1/L0), token-mean, ...
    "actor_rollout_ref.actor.loss_agg_mode": dict(choices=AGG_MODES),
    # L0 for seq-mean-token-sum-norm (the presets set ${data.max_response_length}).
    "actor_rollout_ref.actor.loss_scale_factor": dict(low=L0_BOUNDS[0], high=L0_BOUNDS[1]),
    # Hard clip range of vanilla PPO-style losses, and the dual-clip bound for A < 0 (agpo_dual turns it off
    # with 1e9, a bound no ratio reaches).
    "actor_rollout_ref.actor.clip_ratio": dict(low=0, high=100, low_open=True),
    "actor_rollout_ref.actor.clip_ratio_low": dict(low=0, high=100, low_open=True),
    "actor_rollout_ref.actor.clip_ratio_high": dict(low=0, high=100, low_open=True),
    "actor_rollout_ref.actor.clip_ratio_c": dict(low=1, high=1e12, low_open=True),
    # Soft-gate temperatures of the apo and sapo losses (the apo preset sets 1.0 / 1.5).
    "actor_rollout_ref.actor.tau_pos": dict(low=TEMPERATURE_BOUNDS[0], high=TEMPERATURE_BOUNDS[1]),
    "actor_rollout_ref.actor.tau_neg": dict(low=TEMPERATURE_BOUNDS[0], high=TEMPERATURE_BOUNDS[1]),
    "actor_rollout_ref.actor.entropy_coeff": dict(fixed="the testbed has no entropy bonus"),
    # With use_kl_loss (method=agpo_dual's preset), verl's KL loss kl_loss_coef x agg_loss(kl_penalty(log pi,
    # log pi_ref, kl_loss_type)) against the run's initial policy.
    "actor_rollout_ref.actor.use_kl_loss": {},
}


# --- mode=signal ---------------------------------------------------------------------------------------------

@dataclass
class Signal:
    """Proposition 1, measured (signal.png)."""

    # Group sizes G of the plot.
    group_sizes: list[int] = setting([4, 8, 16], low=2, high=1024, example="[4,8,16]")
    # Success probabilities p on a grid from 0 to 1 with this many points.
    p_points: int = setting(21, low=2, high=1001)
    # Sampled groups per (G, p): the sampling error of each point shrinks as 1/sqrt(groups).
    groups: int = setting(2000, low=1, high=100_000)
    # APO's anchor C_t for the plot, held still (eta = eta_min = 0): prompts with p < C_t count as hard.
    anchor: float = setting(0.5, low=0, high=1)
    # Seed of the sampled groups.
    seed: int = setting(0, low=0, high=SEED_MAX)


# --- the tasks (the `task` group: task=reverse, task=modsum) ----------------------------------------------------

@dataclass
class Reverse:
    """String reversal (recipe_apo/testbed/task.py), the default task: a hard prompt is a long string the policy
    cannot carry, and a random success is almost impossible."""

    name: str = setting("reverse", choices=TASKS)
    # Number of distinct symbols; more makes every string harder.
    alphabet: int = setting(4, low=2, high=1000)
    # Strings have min_len..max_len symbols, drawn uniformly: the spread of difficulties.
    min_len: int = setting(1, low=1, high=100)
    max_len: int = setting(8, low=1, high=100)
    # Mean number of FILL ("thinking") tokens before each symbol in the pretraining demonstrations: how long and
    # how varied the initial policy's answers are. The verifier ignores fillers.
    filler_mean: float = setting(0.6, low=0, high=100)


@dataclass
class Modsum:
    """Digit sums mod K (recipe_apo/testbed/modsum.py): a prompt (K, t) is solved by digits whose sum mod K is t. A
    random policy succeeds about 1/K of the time, so difficulty is the chance of a lucky success (Proposition 1's
    small p), not a skill the policy lacks. The default warm-up (pretrain.steps=200) leaves success by K at about
    0.62, 0.33, 0.17, 0.07, 0.03 (seed 0): above chance, far from solved."""

    name: str = setting("modsum", choices=TASKS)
    # The values of K, drawn uniformly; targets t uniform over [0, K).
    moduli: list[int] = setting([2, 4, 8, 16, 32], low=2, high=1000, example="[2,4,8,16,32]")
    # A demonstration starts with 0..prefix_max random digits, then the fewest digits that complete the sum.
    prefix_max: int = setting(3, low=0, high=100)
    # Mean number of FILL tokens before each digit in the demonstrations (the verifier ignores them).
    filler_mean: float = setting(0.0, low=0, high=100)


TASK_CLASSES = {"reverse": Reverse, "modsum": Modsum}


# --- the whole -----------------------------------------------------------------------------------------------

def _preset_entries() -> dict[str, list[str]]:
    return {name: [f"method={name}"] for name in _presets()}


@dataclass
class Testbed:
    """The CPU testbed: trains a small GRU policy with RL on a verifiable task, once per method and seed, through
    verl's compute_advantage and registered policy losses."""

    # train: the paired comparison (summary.json, report.md, plots). signal: Proposition 1, measured (signal.png).
    # league: every method of `league` on every scenario of it, ranked pair by pair (league.md/json/png).
    mode: str = setting("train", choices=MODES)
    league: League = field(default_factory=League)
    # What to compare, label -> Hydra overrides composed on top of this config and the command line. By default
    # every preset of conf/method/ as `<name>: [method=<name>]`. Add one with
    # '+methods.sapo=["method=grpo","actor_rollout_ref.actor.policy_loss.loss_mode=sapo"]', drop one with
    # ~methods.drgrpo. Every label runs on every seed from the same start.
    methods: dict[str, list[Override]] = field(
        default_factory=_preset_entries,
        metadata={"example": "+methods.sapo=[method=grpo,actor_rollout_ref.actor.policy_loss.loss_mode=sapo]"})
    # Seeds of the paired comparison; each seed has its own pretrained start, prompt stream and evaluation set.
    seeds: list[int] = setting([0, 1, 2, 3], low=0, high=SEED_MAX, example="[0,1,2,3]")
    # Processes running (seed, method) jobs in parallel; 1 runs everything in this process.
    workers: int = setting(2, low=1, high=256)
    # torch threads per job. The model is tiny: parallel processes use cores better than intra-op threads.
    threads_per_worker: int = setting(1, low=1, high=256)
    # Set by the scenario file, recorded in summary.json.
    scenario_name: str = "default"
    # RL rounds (verl's training steps): each samples data.train_batch_size prompts x G responses and updates.
    rounds: int = setting(150, low=1, high=100_000)
    # Evaluate on the fixed evaluation set every this many rounds (round 0 and the last round always).
    eval_every: int = setting(10, low=1, high=100_000)
    # "Early success" averages the evaluations in the first early_fraction of the rounds.
    early_fraction: float = setting(0.25, low=0, high=1, low_open=True)
    # Rounds by which the sampling policy lags the trained one, as an asynchronous trainer delivers responses:
    # round r samples (and takes its old log-probs) from the policy as it was after round r - staleness, and
    # updates the current one. 0: on-policy, the current policy samples. conf/scenario/stale.yaml sets it.
    staleness: int = setting(0, low=0, high=1000)
    # A method's responses per prompt are actor_rollout_ref.rollout.n times this (its mini-batches,
    # ppo_mini_batch_size prompts, grow alike). A method's own setting (league.extra's grpo_2n: 2), where
    # rollout.n is the scenario's, shared by every method of a seed; 1 everywhere else.
    rollout_n_multiplier: int = setting(1, low=1, high=64)
    policy: Policy = field(default_factory=Policy)
    pretrain: Pretrain = field(default_factory=Pretrain)
    eval: Eval = field(default_factory=Eval)
    signal: Signal = field(default_factory=Signal)


ACTOR_KEY = "actor_rollout_ref.actor"
# Nodes that a command line may leave out (``~league.extra``, ``~league.variant_of``).
OPTIONAL = ("league.extra", "league.variant_of")
