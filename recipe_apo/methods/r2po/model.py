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
    """The testbed policy's rollout head (``ModelParts.policy_head``), drawn as ``reset_adaptor`` draws it (1e-6): the
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


def read_config(source: str | Path) -> dict:
    """``source``'s config.json: a JSON object naming a ``model_type`` of ``FAMILIES``, else ``RolloutHeadError``
    naming the file (what transformers would otherwise fail on, several calls later)."""
    path = Path(source) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RolloutHeadError(f"{source}: no readable config.json ({_first_line(exc)})") from None
    if not isinstance(config, dict):
        raise RolloutHeadError(f"{path} holds a JSON {type(config).__name__}, not a model config (a JSON object)")
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise RolloutHeadError(f"{path} names no model_type (got {model_type!r}); a model config names its family: "
                               f"{', '.join(sorted(FAMILIES))}")
    if model_type not in FAMILIES:
        raise RolloutHeadError(f"{path}: model_type {model_type!r} has no rollout-head class; families: "
                               f"{', '.join(sorted(FAMILIES))}")
    return config


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _check_std(std: float) -> None:
    if not isinstance(std, (int, float)) or isinstance(std, bool) or not 0.0 < std < float("inf"):
        raise RolloutHeadError(f"the head's std must be a finite number > 0, got {std!r}")


def _loaded(source: Path, cls: type):
    """``source``'s model as ``cls`` (a rollout-head class, which its config then names) in the weights' own dtype;
    what transformers cannot load is one ``RolloutHeadError`` line naming the folder."""
    from safetensors import SafetensorError
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source)
        config.architectures = [cls.__name__]
        return cls.from_pretrained(source, config=config, torch_dtype="auto")
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as exc:
        raise RolloutHeadError(f"{source}: transformers cannot load the model ({_first_line(exc)})") from None


def add_rollout_head(source: str | Path, target: str | Path, seed: int = 0, std: float = INIT_STD) -> Path:
    """A checkpoint at ``target``: ``source``'s model with a rollout head drawn from N(0, std^2) (seeded), its
    ``architectures`` ``R2PO<Base>``; the weights keep ``source``'s dtype. Refuses a model that has a head (by its
    architecture, or by ``rollout_head.*`` weights: verl's merger writes a trained head under the family's own
    architecture, and a fresh draw would replace it), and a std whose draw is not finite in that dtype; nothing
    is written before."""
    source, target = Path(source), Path(target)
    _check_std(std)
    config = read_config(source)
    if has_rollout_head(config):
        raise RolloutHeadError(f"{source} has a rollout head already ({config['architectures'][0]}); train it as it "
                               "is, or strip it first (python scripts/r2po_head.py strip)")
    held = sorted(name for name in _weight_names(source) if name.startswith(HEAD + "."))
    if held:
        raise RolloutHeadError(f"{source} holds a rollout head already ({held[0]}, ... under architectures "
                               f"{config.get('architectures')}: a merged R2PO checkpoint); to train it on, make its "
                               f"config.json's architectures {residual_class(config['model_type']).__name__}"
                               "; to start a fresh head, strip it first (python scripts/r2po_head.py strip)")
    model = _loaded(source, residual_class(config["model_type"]))
    model.rollout_head.reset(std, torch.Generator().manual_seed(seed))
    weights = [layer.weight for layer in (model.rollout_head.layer1, model.rollout_head.layer2)]
    if not all(bool(torch.isfinite(weight).all()) for weight in weights):
        dtype = weights[0].dtype
        raise RolloutHeadError(f"a head drawn with std {std:g} has non-finite weights in the model's "
                               f"{str(dtype).removeprefix('torch.')} (largest {torch.finfo(dtype).max:.3g}); "
                               "take a smaller std")
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    _copy_beside_weights(source, target)
    return target


def _weight_names(source: Path) -> set[str]:
    """The names of the weights in ``source``'s files (safetensors headers, shard indices, PyTorch files read
    memory-mapped); a file that cannot be read (corrupt, truncated) is one ``RolloutHeadError`` naming it."""
    from safetensors import SafetensorError, safe_open

    names: set[str] = set()
    for path in sorted(source.iterdir()):
        try:
            if path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as weights:
                    names.update(weights.keys())
            elif path.name.endswith(".index.json"):
                index = json.loads(path.read_text())
                names.update(index["weight_map"])
            elif path.suffix == ".bin":
                names.update(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError, SafetensorError) as exc:
            raise RolloutHeadError(f"{path} is not a readable weights file ({_first_line(exc)})") from None
    return names


# What model_for_run writes beside a copy it made: the model it was made from, and that model's files as they were.
MADE_FROM = "r2po_made_from.json"


def source_files(source: Path) -> dict[str, list[int]]:
    """The identity of ``source``'s files, the copy's inputs: per top-level file, [size, mtime in ns]. A file
    rewritten, replaced, added or removed changes it; reading a model's weights to hash them would cost a pass
    over gigabytes at every launch."""
    files = {}
    for path in sorted(source.iterdir()):
        if path.is_file():
            info = path.stat()
            files[path.name] = [info.st_size, info.st_mtime_ns]
    return files


def _changed(made: dict[str, list[int]], now: dict[str, list[int]]) -> str:
    """What differs between two ``source_files``: the first file changed, added or removed, in words."""
    for name in sorted(set(made) | set(now)):
        if name not in now:
            return f"{name} was removed"
        if name not in made:
            return f"{name} was added"
        if made[name] != now[name]:
            return f"{name} was rewritten"
    return ""


def model_for_run(source: str | Path, folder: str | Path) -> Path:
    """The model a run of R2PO trains: ``source`` when it carries a rollout head, else a copy with one in
    ``folder``, made once (a resumed run finds it, and the reference model of the KL is its start). A copy made
    from another model, or from ``source`` before its files changed (``source_files``), is refused, never
    overwritten: the run's checkpoints were trained from it. A copy whose record predates ``source_files`` is
    checked by time: refused where a file of ``source`` is newer than the record."""
    source, folder = Path(source).expanduser().resolve(), Path(folder)
    if has_rollout_head(read_config(source)):
        return source
    record = folder / MADE_FROM
    if folder.exists():
        try:
            made = json.loads(record.read_text())
            made_from = made["source"]
        except (OSError, ValueError, KeyError, TypeError):
            raise RolloutHeadError(f"{folder} exists but holds no rollout-head copy the recipe made (no readable "
                                   f"{MADE_FROM}); remove it, or give the run another checkpoint folder") from None
        if made_from != str(source):
            raise RolloutHeadError(f"{folder} holds a rollout-head copy of {made_from}, not of {source}; remove it, "
                                   "or give the run another checkpoint folder")
        now = source_files(source)
        files = made.get("files")
        if isinstance(files, dict):
            change = _changed(files, now)
        else:  # a record of an earlier version: only the time it was written
            stamp = record.stat().st_mtime_ns
            change = next((f"{name} was rewritten" for name, (_, mtime) in now.items() if mtime > stamp), "")
        if change:
            raise RolloutHeadError(f"{folder} holds a rollout-head copy of {source} as it was before it changed "
                                   f"({change} since); remove the copy (and the checkpoints trained from it), or "
                                   "give the run another checkpoint folder")
        return folder
    files = source_files(source)  # before the copy reads them: a change while it copies shows at the next launch
    add_rollout_head(source, folder)
    record.write_text(json.dumps({"source": str(source), "seed": 0, "std": INIT_STD, "files": files}) + "\n")
    return folder


def strip_rollout_head(source: str | Path, target: str | Path) -> Path:
    """The model users keep (pi_base) at ``target``: ``source``'s weights without ``rollout_head.*``, its
    ``architectures`` the family's own. ``source`` names a rollout-head architecture, or holds ``rollout_head.*``
    weights under the family's own (what verl's model merger writes of a checkpoint). Refuses a model with
    neither."""
    source, target = Path(source), Path(target)
    found = read_config(source)
    held = any(name.startswith(HEAD + ".") for name in _weight_names(source))  # also: every weights file readable
    if not has_rollout_head(found) and not held:
        raise RolloutHeadError(f"{source} has no rollout head (architectures {found.get('architectures')}, "
                               f"no {HEAD}.* weights)")
    model = _loaded(source, residual_class(found["model_type"]))
    config = model.config
    base = _base_class(config.model_type)
    config.architectures = [base.__name__]
    plain = base(config).to(model.dtype)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(HEAD + ".")}
    plain.load_state_dict(state, strict=True)
    target.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(target)
    _copy_beside_weights(source, target)
    return target
