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

``add_rollout_head`` makes such a checkpoint from a plain one, the head drawn as the source's ``reset_adaptor``
(every weight N(0, 1e-6^2)); ``model_for_run`` gives the model a run trains (the run's own when it has the head,
else such a copy, made once in the run's checkpoint folder); ``strip_rollout_head`` gives back the plain model
(pi_base) for inference.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from recipe_apo.methods.base import BASE_HEAD as BASE
from recipe_apo.methods.base import ROLLOUT_HEAD as ROLL

HEAD = "rollout_head"        # the head's parameters are rollout_head.*; logits_head ROLL: z + delta, BASE: z
PREFIX = "R2PO"              # R2PO<Base architecture>
INIT_STD = 1e-6              # the source's reset_adaptor: random_init(std=1e-6) on both layers

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
        """The source's ``reset_adaptor``: every weight drawn from N(0, std^2)."""
        for layer in (self.layer1, self.layer2):
            layer.weight.normal_(0.0, std, generator=generator)


def new_rollout_head(hidden_size: int, vocab_size: int, generator: torch.Generator | None = None) -> RolloutHead:
    """A rollout head drawn as ``reset_adaptor`` draws it (the testbed's policy gains one: ``Method.policy_head``)."""
    head = RolloutHead(hidden_size, vocab_size)
    head.reset(generator=generator)
    return head


class ResidualHeadMixin:
    """What a family's causal LM class gains (put first in the bases): the rollout head and ``logits_head``."""

    def __init__(self, config, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        self.rollout_head = RolloutHead(config.hidden_size, config.vocab_size)
        self.rollout_head.reset()
        self.logits_head = ROLL
        # A hook on the output layer, so that every way the family's forward computes its logits (and any slice of
        # positions it keeps) gets the residual of the same hidden states.
        self.get_output_embeddings().register_forward_hook(self._residual)

    def _residual(self, output_layer: nn.Module, inputs: tuple, logits: torch.Tensor) -> torch.Tensor:
        if self.logits_head == BASE:
            return logits
        hidden = inputs[0].detach()
        return logits.detach() + self.rollout_head(hidden).to(logits.dtype)

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
