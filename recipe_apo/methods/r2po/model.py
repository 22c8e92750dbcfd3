"""R2PO's model: a causal LM with a residual rollout head (RRPO-ARR/Code at 8a2cc4d,
``simple_grpo_v1/qwen_with_adaptor.py``), on the Hugging Face side (the FSDP actor, the reference, the CPU
rehearsal's ``hf`` engine). The vLLM side is ``vllm_model``.

Symbols: h_t, the model's final hidden state (the input of its output layer, after the last norm); z_t = W_lm h_t,
the base logits; delta_t = W2 ReLU(W1 h_t), the residual (``rollout_head.layer1`` is W1, d x d, and
``rollout_head.layer2`` W2, V x d, the source's names; no biases). pi_base = softmax(z_t) is the model users keep;
pi_roll = softmax(z_t + delta_t) samples the rollouts.

The model's ``logits_head`` says which its forward returns: ``roll`` (the default, so that ``generate`` samples
pi_roll) or ``base``. With ``roll`` the base logits and h_t enter the residual detached: a loss on pi_roll trains
the head alone (the source's head phase freezes everything else; here the rest gets no gradient, which AdamW then
leaves untouched). A class per family of ``FAMILIES`` (``R2PO<Base>``, e.g. ``R2POQwen2ForCausalLM``) is what a
checkpoint's ``architectures`` names; ``register_hf_models`` lets transformers' ``AutoModelForCausalLM`` pick it by
that name (plain checkpoints of the family still load their own class).

``add_rollout_head`` makes such a checkpoint from a plain one, the head drawn as the released script effectively
draws it (every weight N(0, 0.02^2): ``INIT_STD``); ``model_for_run`` gives the model a run trains (the run's own
when it has the head, else such a copy, made once in the run's checkpoint folder); ``strip_rollout_head`` gives back
the plain model (pi_base) for inference.

How far pi_roll is from pi_base (``measuring_head_gap``, asked for by the actor's update passes through
``recipe_apo.integration.model_classes``): per position t, ``KL_t = sum_v pi_roll(v) (log pi_roll(v) - log
pi_base(v))`` and the residual's range ``max_v d_t,v - min_v d_t,v`` (d_t = the returned roll logits minus z_t,
in the logits' own dtype: what the forward adds, rounding included; the range bounds |log pi_roll(v) - log
pi_base(v)| for every token v), both at temperature 1, each averaged over the response tokens' positions.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
from torch import nn

from recipe_apo.methods.base import BASE_HEAD as BASE
from recipe_apo.methods.base import ROLLOUT_HEAD as ROLL

HEAD = "rollout_head"        # the head's parameters are rollout_head.*; logits_head ROLL: z + delta, BASE: z
PREFIX = "R2PO"              # R2PO<Base architecture>
# The released script's effective start (docs/beside_apo.md, "The head's start"): its head stage loads the base model
# into its rollout-head class and never passes --reset_adaptor, so transformers (4.57.1, its requirements) draws the
# missing rollout_head.* as every missing Linear weight, N(0, config.initializer_range^2): 0.02 for its Qwen models
# (and for SmolLM2-135M here). On SmolLM2 that perturbs the logits by 0.32 (std of delta), KL(pi_roll || pi_base)
# 0.027 per token; reset_adaptor's 1e-6 by 8e-10, under float32's resolution (scripts/r2po_head_scale.py).
INIT_STD = 0.02
RESET_STD = 1e-6             # the source's reset_adaptor (random_init(std=1e-6)), which its script never calls
# Positions x vocabulary entries of one chunk of the head-gap measure (float32: 64 MiB a tensor).
GAP_CHUNK = 1 << 24
# The head-gap metrics, as the actor's update logs them (verl names a worker's metrics actor/...; per micro-batch,
# the mean over its response tokens; verl then averages the micro-batches).
HEAD_KL = "actor/r2po_head_kl"
HEAD_LOGIT_GAP = "actor/r2po_head_logit_gap"

# model_type -> (transformers module, causal LM class): the families with a rollout-head class.
FAMILIES = {
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3ForCausalLM"),
    "llama": ("transformers.models.llama.modeling_llama", "LlamaForCausalLM"),
}


class RolloutHeadError(ValueError):
    """A model or checkpoint cannot carry (or lose) a rollout head; the message names it."""


class RolloutHead(nn.Module):
    """delta = W2 ReLU(W1 h): the residual on the base logits (the source's ``RolloutHead``)."""

    def __init__(self, hidden_size: int, vocab_size: int) -> None:
        super().__init__()
        self.layer1 = nn.Linear(hidden_size, hidden_size, bias=False)
        self.layer2 = nn.Linear(hidden_size, vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layer2(torch.relu(self.layer1(hidden)))

    @torch.no_grad()
    def reset(self, std: float = INIT_STD, generator: torch.Generator | None = None) -> None:
        """Every weight drawn from N(0, std^2) (the source's ``random_init``; its ``reset_adaptor`` takes 1e-6)."""
        for layer in (self.layer1, self.layer2):
            layer.weight.normal_(0.0, std, generator=generator)


def new_rollout_head(hidden_size: int, vocab_size: int, generator: torch.Generator | None = None) -> RolloutHead:
    """The testbed policy's rollout head (``Method.policy_head``), drawn as ``reset_adaptor`` draws it (1e-6): the
    start results/league_r2po.md measured. At the testbed's GRU width (64, |h| < 8) the source's effective 0.02
    start would perturb its logits by 0.018 at most (s^2 sqrt(d/2) |h|), and its learning rate 1e-3 grows either
    start within a few rounds."""
    head = RolloutHead(hidden_size, vocab_size)
    head.reset(RESET_STD, generator=generator)
    return head


def head_gap_rows(base: torch.Tensor, roll: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of logits ``base`` (z) and ``roll`` (z + delta), shaped (..., V): KL(pi_roll || pi_base) and the
    range of roll - base over the vocabulary, in float32."""
    base, roll = base.float(), roll.float()
    log_base, log_roll = torch.log_softmax(base, dim=-1), torch.log_softmax(roll, dim=-1)
    kl = (log_roll.exp() * (log_roll - log_base)).sum(dim=-1)
    delta = roll - base
    return kl, delta.amax(dim=-1) - delta.amin(dim=-1)


def response_mean(values: torch.Tensor, prompt_lens: torch.Tensor, response_lens: torch.Tensor
                  ) -> Optional[torch.Tensor]:
    """The mean of per-position ``values`` over the positions that predict each sequence's response tokens (the
    last prompt position up to the response's last but one), or None where the layout does not fit.

    ``values`` is laid out as verl's actor lays out a micro-batch: packed, (1, P) with the sequences one after
    another (P >= the sum of their lengths: packing may pad the end), or padded, (B, S) one sequence a row from its
    first column (S >= the longest). Each sequence is its prompt (length >= 1) then its response; a slice of the
    sequences (Ulysses sequence parallelism) fits neither layout."""
    prompt_lens, response_lens = prompt_lens.long().cpu(), response_lens.long().cpu()
    if values.dim() != 2 or int(response_lens.sum()) == 0 or bool((prompt_lens < 1).any()):
        return None
    lengths = prompt_lens + response_lens
    rows, columns = values.shape
    if rows == 1 and columns >= int(lengths.sum()):
        starts = torch.cumsum(lengths, 0) - lengths
    elif rows == lengths.numel() and columns >= int(lengths.max()):
        starts = torch.arange(rows) * columns
    else:
        return None
    first = starts + prompt_lens - 1  # the position whose logits predict the response's first token
    within = torch.arange(int(response_lens.sum())) - torch.repeat_interleave(
        torch.cumsum(response_lens, 0) - response_lens, response_lens)
    positions = torch.repeat_interleave(first, response_lens) + within
    return values.reshape(-1)[positions.to(values.device)].mean()


class ResidualHeadMixin:
    """What a family's causal LM class gains (put first in the bases): the rollout head and ``logits_head``."""

    def __init__(self, config, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        self.rollout_head = RolloutHead(config.hidden_size, config.vocab_size)
        self.rollout_head.reset()
        self.logits_head = ROLL
        # Per position (KL, range) of the last forward while measuring_head_gap is held; None: not measuring.
        self._head_gap: Optional[list] = None
        # A hook on the output layer, so that every way the family's forward computes its logits (and any slice of
        # positions it keeps) gets the residual of the same hidden states.
        self.get_output_embeddings().register_forward_hook(self._residual)

    def _residual(self, output_layer: nn.Module, inputs: tuple, logits: torch.Tensor) -> torch.Tensor:
        hidden = inputs[0].detach()
        if self.logits_head == BASE:
            if self._head_gap is not None:
                self._keep_head_gap(logits, hidden, None)
            return logits
        roll = logits.detach() + self.rollout_head(hidden).to(logits.dtype)
        if self._head_gap is not None:
            self._keep_head_gap(logits, hidden, roll)
        return roll

    @torch.no_grad()
    def _keep_head_gap(self, base: torch.Tensor, hidden: torch.Tensor, roll: Optional[torch.Tensor]) -> None:
        """``head_gap_rows`` of this forward's positions, a chunk of positions at a time (a (positions x V) float32
        copy of the logits would be as large as the logits again); with the base head, the residual is computed
        here as the roll head adds it."""
        shape, vocab = base.shape[:-1], base.shape[-1]
        base, hidden = base.detach().reshape(-1, vocab), hidden.reshape(-1, hidden.shape[-1])
        roll = None if roll is None else roll.detach().reshape(-1, vocab)
        step = max(1, GAP_CHUNK // vocab)
        kl, spread = [], []
        for start in range(0, base.shape[0], step):
            z = base[start:start + step]
            rolled = (z + self.rollout_head(hidden[start:start + step]).to(z.dtype) if roll is None
                      else roll[start:start + step])
            chunk_kl, chunk_spread = head_gap_rows(z, rolled)
            kl.append(chunk_kl)
            spread.append(chunk_spread)
        self._head_gap[:] = [torch.cat(kl).reshape(shape), torch.cat(spread).reshape(shape)]

    @contextlib.contextmanager
    def measuring_head_gap(self) -> Iterator[Callable[[torch.Tensor, torch.Tensor], dict[str, float]]]:
        """While held, each forward (with either logits head) keeps how far pi_roll is from pi_base at each
        position; yields ``gap(prompt_lens, response_lens)``: the last forward's ``HEAD_KL`` and ``HEAD_LOGIT_GAP``,
        each the mean over the response tokens (``response_mean``; {} where the layout does not fit or nothing was
        kept). The logits the forward returns are the same measured or not."""
        self._head_gap = []

        def gap(prompt_lens: torch.Tensor, response_lens: torch.Tensor) -> dict[str, float]:
            if not self._head_gap:
                return {}
            means = [response_mean(rows, prompt_lens, response_lens) for rows in self._head_gap]
            if any(mean is None for mean in means):
                return {}
            return {HEAD_KL: float(means[0]), HEAD_LOGIT_GAP: float(means[1])}

        try:
            yield gap
        finally:
            self._head_gap = None

    def _init_weights(self, module: nn.Module) -> None:
        # transformers initialises the weights a checkpoint lacks through here: the head as the source draws it.
        head = self._modules.get(HEAD)  # absent while the family's own __init__ initialises its weights
        if head is not None and any(module is layer for layer in head.children()):
            # transformers' own normal_ leaves a weight the checkpoint loaded (it flags it) as it is.
            from transformers import initialization

            with torch.no_grad():
                initialization.normal_(module.weight, 0.0, INIT_STD)
            return
        super()._init_weights(module)

    @contextlib.contextmanager
    def select_logits_head(self, name: str) -> Iterator[None]:
        """The forward returns ``name``'s logits (``roll`` or ``base``) while held."""
        if name not in (ROLL, BASE):
            raise RolloutHeadError(f"logits head {name!r}: the model has {ROLL!r} and {BASE!r}")
        previous, self.logits_head = self.logits_head, name
        try:
            yield
        finally:
            self.logits_head = previous


def architecture(base_architecture: str) -> str:
    return PREFIX + base_architecture


def _base_class(model_type: str) -> type:
    if model_type not in FAMILIES:
        raise RolloutHeadError(f"model_type {model_type!r} has no rollout-head class; families: "
                               f"{', '.join(sorted(FAMILIES))}")
    module, name = FAMILIES[model_type]
    return getattr(importlib.import_module(module), name)


_CLASSES: dict[str, type] = {}


def residual_class(model_type: str) -> type:
    """The rollout-head class of a family (one class object per family, so that transformers maps it once)."""
    if model_type not in _CLASSES:
        base = _base_class(model_type)
        name = architecture(base.__name__)
        _CLASSES[model_type] = type(name, (ResidualHeadMixin, base), {"__module__": __name__, "__qualname__": name})
        globals()[name] = _CLASSES[model_type]  # picklable by name
    return _CLASSES[model_type]


def register_hf_models() -> None:
    """``AutoModelForCausalLM`` loads a checkpoint whose ``architectures`` names ``R2PO<Base>`` with its rollout-head
    class, and every other checkpoint of the family with the family's own class; idempotent."""
    from transformers import AutoConfig, AutoModelForCausalLM

    for model_type in FAMILIES:
        config_class = type(AutoConfig.for_model(model_type))
        cls = residual_class(model_type)
        mapped = AutoModelForCausalLM._model_mapping[config_class]
        if isinstance(mapped, tuple) and cls in mapped:
            continue
        AutoModelForCausalLM.register(config_class, (_base_class(model_type), cls), exist_ok=True)


def has_rollout_head(config) -> bool:
    """Whether a model config (transformers' or its dict) names a rollout-head architecture."""
    names = config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)
    return any(str(name).startswith(PREFIX) for name in names or ())


def _copy_beside_weights(source: Path, target: Path) -> None:
    """The tokenizer's and every other file of ``source`` but its weights and config (written by transformers)."""
    for path in source.iterdir():
        weights = path.suffix in (".safetensors", ".bin", ".pt") or path.name.endswith(".index.json")
        if path.is_file() and not weights and path.name != "config.json" and not (target / path.name).exists():
            shutil.copy2(path, target / path.name)


def _config(source: Path) -> dict:
    try:
        return json.loads((source / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise RolloutHeadError(f"{source}: no readable config.json ({exc})") from exc


def add_rollout_head(source: str | Path, target: str | Path, seed: int = 0, std: float = INIT_STD) -> Path:
    """A checkpoint at ``target``: ``source``'s model with a rollout head drawn from N(0, std^2) (seeded), its
    ``architectures`` ``R2PO<Base>``; the weights keep ``source``'s dtype. Refuses a model that has a head."""
    from transformers import AutoConfig

    source, target = Path(source), Path(target)
    if has_rollout_head(_config(source)):
        raise RolloutHeadError(f"{source} has a rollout head already ({_config(source)['architectures'][0]})")
    config = AutoConfig.from_pretrained(source)
    cls = residual_class(config.model_type)
    config.architectures = [cls.__name__]
    model = cls.from_pretrained(source, config=config, torch_dtype="auto")
    model.rollout_head.reset(std, torch.Generator().manual_seed(seed))
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    _copy_beside_weights(source, target)
    return target


def _weight_names(source: Path) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for path in source.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as weights:
            names.update(weights.keys())
    return names


# What model_for_run writes beside a copy it made: the model it was made from.
MADE_FROM = "r2po_made_from.json"


def model_for_run(source: str | Path, folder: str | Path) -> Path:
    """The model a run of R2PO trains: ``source`` when it carries a rollout head, else a copy with one in
    ``folder``, made once (a resumed run finds it, and the reference model of the KL is its start). A copy made
    from another model is refused, never overwritten."""
    source, folder = Path(source).expanduser().resolve(), Path(folder)
    if has_rollout_head(_config(source)):
        return source
    record = folder / MADE_FROM
    if folder.exists():
        try:
            made_from = json.loads(record.read_text())["source"]
        except (OSError, ValueError, KeyError, TypeError):
            raise RolloutHeadError(f"{folder} exists but holds no rollout-head copy the recipe made (no readable "
                                   f"{MADE_FROM}); remove it, or give the run another checkpoint folder") from None
        if made_from != str(source):
            raise RolloutHeadError(f"{folder} holds a rollout-head copy of {made_from}, not of {source}; remove it, "
                                   "or give the run another checkpoint folder")
        return folder
    add_rollout_head(source, folder)
    record.write_text(json.dumps({"source": str(source), "seed": 0, "std": INIT_STD}) + "\n")
    return folder


def strip_rollout_head(source: str | Path, target: str | Path) -> Path:
    """The model users keep (pi_base) at ``target``: ``source``'s weights without ``rollout_head.*``, its
    ``architectures`` the family's own. ``source`` names a rollout-head architecture, or holds ``rollout_head.*``
    weights under the family's own (what verl's model merger writes of a checkpoint). Refuses a model with
    neither."""
    from transformers import AutoConfig

    source, target = Path(source), Path(target)
    if not has_rollout_head(_config(source)) and not any(n.startswith(HEAD + ".") for n in _weight_names(source)):
        raise RolloutHeadError(f"{source} has no rollout head (architectures {_config(source).get('architectures')}, "
                               f"no {HEAD}.* weights)")
    config = AutoConfig.from_pretrained(source)
    config.architectures = [residual_class(config.model_type).__name__]
    model = residual_class(config.model_type).from_pretrained(source, config=config, torch_dtype="auto")
    base = _base_class(config.model_type)
    config.architectures = [base.__name__]
    plain = base(config).to(model.dtype)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(HEAD + ".")}
    plain.load_state_dict(state, strict=True)
    target.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(target)
    _copy_beside_weights(source, target)
    return target
