"""A tiny Qwen2 model, its tokenizer and a verifiable toy dataset, made on the spot for a CPU rehearsal of verl.

``make_tiny(out_dir)`` writes, with nothing downloaded::

    out_dir/model/             config.json, model.safetensors, generation_config.json,
                               tokenizer.json, tokenizer_config.json, chat_template.jinja
    out_dir/data/train.parquet
    out_dir/data/val.parquet

and returns their paths plus the path of the task's reward (``recipe_apo/cpu/reward.py``).

The task has two data sources that the model learns differently, so per-source statistics (e.g. a
per-data-source capability anchor) have something to tell apart:

- ``tiny_add``: ``"3+4="`` -> ``"7"``, single-digit sums: a 100-entry table, learned entry by entry;
- ``tiny_reverse``: ``"reverse\\nabc"`` -> ``"cba"``, 2-4 letters reversed: mostly new words, solved once the
  model finds the copying rule, which it does suddenly, at a seed-dependent step.

With the defaults (seed 0, 300 warm-up steps) ``tiny_add`` is the hard one (about 15% of temperature-1 samples
right on val) and ``tiny_reverse`` the easy one (about 80%); other seeds keep the two apart by 0.1-0.4 but
can swap them.

Why a warm-up: with random weights every sampled answer is wrong, every reward is 0 and every GRPO group has
zero advantage, so a rehearsal would exercise nothing. ``warmup_steps`` Adam steps of supervised training on
the train split make the model solve part of the prompts when sampling at temperature 1, so groups of 2-4
responses contain both successes and failures. ``warmup_steps=0`` keeps the random-weight model.

The tokenizer is a byte-level BPE trained on the task's own text, with Qwen2's exact normalizer and
pre-tokenizer: transformers 5 loads any folder whose config says ``model_type: qwen2`` with ``Qwen2Tokenizer``,
whatever ``tokenizer_config.json`` names, and that class rebuilds the pipeline around the saved vocabulary and
merges. Built the same way, both loaders (and ``tokenizers.Tokenizer.from_file``) encode identically.

Deterministic for a seed (data, tokenizer, weights); re-running into the same folder replaces ``model/`` and
``data/`` and leaves anything else there alone. It replaces only what it made: every folder it creates holds a
mark, ``.recipe-apo-made``, and an existing ``model/`` or ``data/`` that is not empty and has no mark (a model of
yours, say) is refused before anything is built, as is an ``out_dir`` that is a file, lies under a file or is
not writable (``check_out_dir``).

CLI: ``python -m recipe_apo.cpu.make_tiny OUT_DIR [--seed N] [--warmup-steps N] [--n-train N] [--n-val N]
[--measure K]``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import stat
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from recipe_apo.cpu import reward as task_reward
from recipe_apo.errors import RecipeError

if TYPE_CHECKING:  # the heavy libraries load only when something is built, so bad CLI arguments fail at once
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# The token names Qwen2 models use, so verl's Qwen-specific chat handling (e.g. its ChatML boundary logic,
# which looks up "<|im_end|>" and needs "\n" to be one token) treats this model as a Qwen2.
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# Qwen2's ChatML without its default system prompt (which would be most of every prompt's length).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

DEFAULT_WARMUP_STEPS = 300
# At most this many merges beyond the 256 byte symbols and the special tokens (a vocabulary of a few hundred).
BPE_MERGES = 48
# A pair merges only if it occurs in at least 1/8 of the conversations: the template's words ("user",
# "assistant", "reverse") do, random letter pairs do not, so letters stay single tokens at any dataset size
# (reversing merged letter pairs would be a different, harder task). Digits never merge: Qwen2's
# pre-tokenizer isolates each one.
BPE_MIN_SHARE = 8

# Model shape: small enough that the warm-up and a verl step take seconds on two cores. Head size 32 (64 / 2
# heads): vLLM's CPU attention has no kernel below 32, and one model serves both rehearsal engines.
MODEL_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
)
# Warm-up optimizer: Adam at this rate on random minibatches of this many train rows. With the default steps
# this lands mid-way (about half the val samples solved at seed 0-3); 1e-2 diverges, and much longer runs
# saturate or (at this rate) spike back down.
WARMUP_LR = 3e-3
WARMUP_BATCH = 32

LETTERS = "abcdefghijklmnopqrstuvwxyz"
REVERSE_LENGTHS = (2, 4)  # shortest and longest word to reverse
ADD_SOURCE, REVERSE_SOURCE = "tiny_add", "tiny_reverse"
assert {ADD_SOURCE, REVERSE_SOURCE} == task_reward.DATA_SOURCES

Progress = Optional[Callable[[str], Any]]


# ----------------------------------------------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------------------------------------------


def _add_examples(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """``n`` single-digit sums, going through the whole 100-entry table (in a shuffled order) before any repeats,
    so a train split of at least 100 add rows holds every val prompt: the model can recall them all."""
    table = [(f"{a}+{b}=", str(a + b)) for a in range(10) for b in range(10)]
    examples: list[tuple[str, str]] = []
    while len(examples) < n:
        rng.shuffle(table)
        examples.extend(table[: n - len(examples)])
    return examples


def _reverse_examples(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """``n`` random 2-4 letter words and their reversals; mostly new words in every split (26**4 of them), so
    solving them takes a copying rule, not recall."""
    examples = []
    for _ in range(n):
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(*REVERSE_LENGTHS)))
        # A newline, not a space, before the word: Qwen2's pre-tokenizer would glue a space to the first letter
        # (" abc"), and BPE would then merge " a", " b", ..., so the prompt's letters would not be the answer's.
        examples.append((f"reverse\n{word}", word[::-1]))
    return examples


def task_rows(split: str, n: int, seed: int) -> list[dict]:
    """``n`` rows in verl's RL parquet layout (as ``examples/data_preprocess/gsm8k.py`` writes it): the first
    ``ceil(n/2)`` draws are sums, the rest reversals, shuffled together.

    Splits are drawn independently, so val shares add prompts with train (and a split repeats them past 100);
    a rehearsal checks mechanics, not generalization.
    """
    # One stream per split, so the train rows do not change when n_val does.
    rng = random.Random(f"{seed}/{split}")
    n_add = (n + 1) // 2
    tagged = [(ADD_SOURCE, "math", ex) for ex in _add_examples(n_add, rng)]
    tagged += [(REVERSE_SOURCE, "string", ex) for ex in _reverse_examples(n - n_add, rng)]
    rng.shuffle(tagged)
    return [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": question}],
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index},
        }
        for index, (source, ability, (question, answer)) in enumerate(tagged)
    ]


def _write_parquet(rows: list[dict], path: Path) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


# ----------------------------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------------------------


def _render(messages: list[dict], answer: Optional[str] = None) -> str:
    """The chat template's text for a prompt (and the answer turn when given), without a jinja dependency."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    text += f"{IM_START}assistant\n"
    return text if answer is None else f"{text}{answer}{IM_END}\n"


def build_tokenizer(rows: list[dict]) -> "PreTrainedTokenizerBase":
    """A byte-level BPE trained on the rows' conversations, wrapped for transformers with the chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Exactly what Qwen2Tokenizer installs around a loaded vocabulary (see the module docstring).
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(SPECIAL_TOKENS) + BPE_MERGES,
        min_frequency=max(2, len(rows) // BPE_MIN_SHARE),
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 bytes, so any text (e.g. a sampled response re-encoded by verl) has an encoding.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The trainer does not split out special tokens, so feed it the text between them; otherwise it would
    # spend merges on "<|", "im", ... that encoding never uses.
    texts = []
    for row in rows:
        text = _render(row["prompt"], row["reward_model"]["ground_truth"])
        for special in SPECIAL_TOKENS:
            text = text.replace(special, "\0")
        texts.extend(piece for piece in text.split("\0") if piece)
    tok.train_from_iterator(texts, trainer=trainer)

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        # Qwen2's template adds no BOS; generation prompts are built by the chat template alone.
        bos_token=None,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------


@contextmanager
def _seeded(seed: int, one_thread: bool = False) -> Iterator[None]:
    """Run with torch's global RNG seeded, restoring the caller's RNG state afterwards.

    ``one_thread``: also run torch on one CPU thread. This model's kernels are too small to gain from more,
    and with more, a core busy with anything else stalls every step (measured: 2 s a step on 2 threads
    against 15-25 ms on one); a fixed thread count also keeps float reductions, hence the weights, the same
    on any machine.
    """
    import torch

    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if one_thread:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


def build_model(tokenizer: "PreTrainedTokenizerBase", seed: int) -> "PreTrainedModel":
    """A randomly initialized float32 Qwen2ForCausalLM sized for ``tokenizer``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        # As in Qwen2.5: BOS names <|endoftext|> (no template uses it), generation ends at <|im_end|>.
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
        **MODEL_SHAPE,
    )
    with _seeded(seed):
        model = Qwen2ForCausalLM(config)
    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def _supervised_batch(tokenizer: "PreTrainedTokenizerBase", rows: list[dict]) -> dict[str, "torch.Tensor"]:
    """Right-padded prompt+answer+<|im_end|> sequences; labels are -100 except on the answer and end token."""
    import torch

    prompts = [tokenizer.encode(_render(r["prompt"]), add_special_tokens=False) for r in rows]
    answers = [
        tokenizer.encode(r["reward_model"]["ground_truth"], add_special_tokens=False) + [tokenizer.eos_token_id]
        for r in rows
    ]
    width = max(len(p) + len(a) for p, a in zip(prompts, answers))
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, a) in enumerate(zip(prompts, answers)):  # once per row, at set-up, not per step
        n = len(p) + len(a)
        input_ids[i, :n] = torch.tensor(p + a)
        labels[i, len(p) : n] = torch.tensor(a)
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def warm_up(
    model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase", rows: list[dict], steps: int, seed: int
) -> Optional[float]:
    """``steps`` Adam steps on minibatches of ``rows`` (loss on answer tokens only); returns the last loss."""
    import torch

    if steps == 0:
        return None
    batch = _supervised_batch(tokenizer, rows)
    n = batch["input_ids"].shape[0]
    optimizer = torch.optim.Adam(model.parameters(), lr=WARMUP_LR)
    model.train()
    loss = None
    with _seeded(seed + 1, one_thread=True):
        for _ in range(steps):
            pick = torch.randint(0, n, (min(WARMUP_BATCH, n),))
            loss = model(**{k: v[pick] for k, v in batch.items()}).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    model.eval()
    return loss.item()


def success_rates(
    model: "PreTrainedModel",
    tokenizer: "PreTrainedTokenizerBase",
    rows: list[dict],
    samples: int = 8,
    seed: int = 0,
    max_new_tokens: int = 16,
) -> dict[str, float]:
    """Fraction of ``samples`` temperature-1 responses per prompt that ``reward.compute_score`` accepts, per
    data source and ``"all"``. Also how the success spreads over prompts: ``"solved_mostly"`` and
    ``"failed_mostly"``, the fraction of prompts solved in at least 75% / at most 25% of samples, and
    ``"mixed_group4"``, the chance that a GRPO group of 4 responses to a random prompt holds both a success and
    a failure (from each prompt's rate p: ``1 - p**4 - (1-p)**4``), i.e. has a non-zero advantage.

    Plain ``model.generate`` on the chat-templated prompts, left-padded, with pure sampling (top-k/top-p off,
    as in an RL rollout).
    """
    import torch

    texts = [_render(r["prompt"]) for r in rows]
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = padding_side
    with _seeded(seed, one_thread=True), torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=samples,
        )
    responses = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    # generate() puts each prompt's samples next to each other: response i * samples + j answers rows[i].
    truths = [(r["data_source"], r["reward_model"]["ground_truth"]) for r in rows for _ in range(samples)]
    scores = torch.tensor(
        [task_reward.compute_score(source, text, truth) for (source, truth), text in zip(truths, responses)]
    ).view(len(rows), samples)
    per_prompt = scores.mean(dim=1)
    sources = [r["data_source"] for r in rows]
    result = {"all": float(per_prompt.mean())}
    for source in sorted(set(sources)):
        result[source] = float(per_prompt[torch.tensor([s == source for s in sources])].mean())
    result["solved_mostly"] = float((per_prompt >= 0.75).float().mean())
    result["failed_mostly"] = float((per_prompt <= 0.25).float().mean())
    result["mixed_group4"] = float((1 - per_prompt**4 - (1 - per_prompt) ** 4).mean())
    return result


# ----------------------------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------------------------


# Written into every folder make_tiny creates: what a later make_tiny may replace.
MADE_MARK = ".recipe-apo-made"
MADE_TEXT = ("Made by recipe-apo (python -m recipe_apo.cpu.make_tiny); a later make_tiny into the folder above "
             "replaces this folder.\n")
# The folders make_tiny replaces in out_dir: its outputs and the scratch folder it builds them in.
SCRATCH = ".make_tiny.partial"
REPLACED = ("model", "data", SCRATCH)


class OutDirError(RecipeError, ValueError):
    """A folder make_tiny (or the rehearsal) cannot write into, or would replace without having made it."""


def folder_problem(path: Path) -> Optional[str]:
    """Why ``path`` cannot be a folder to write into, or None when it can: words that follow its name (``is ...``)
    when ``path`` itself is at fault, else a sentence naming the parent at fault.

    It is a file, or the first of its parents that exists is a file, not writable or cannot be reached. Creates
    nothing: a refused command leaves the file system as it was.
    """
    path = Path(path).absolute()
    for candidate in (path, *path.parents):
        try:
            mode = candidate.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there yet (or under a file: found further up)
        except OSError as exc:  # no permission to look, a symlink loop, ...
            return f"cannot reach {candidate} ({exc.strerror or exc})"
        if not stat.S_ISDIR(mode):
            return "is a file, not a folder" if candidate == path else f"{candidate} is a file, not a folder"
        # An existing folder must be listable too: what is in it decides what may be replaced.
        if not os.access(candidate, os.W_OK | os.X_OK | (os.R_OK if candidate == path else 0)):
            where = "" if candidate == path else f"{candidate} "
            return f"{where}is not writable for you (read-only, or another user's)"
        return None
    return None


def made_by_recipe(folder: Path) -> bool:
    """Whether ``folder`` holds make_tiny's mark, or nothing at all: a folder make_tiny may replace. A link, or
    a file, is never one."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    entries = os.listdir(folder)
    return not entries or MADE_MARK in entries


def _mark(folder: Path) -> None:
    (folder / MADE_MARK).write_text(MADE_TEXT)


def check_out_dir(out_dir: str | os.PathLike) -> Path:
    """Refuse, before anything is built or removed, an ``out_dir`` make_tiny cannot write into, or whose
    ``model/``, ``data/`` (or scratch folder) it would replace without having made them; returns ``out_dir`` as a
    Path. Writes nothing."""
    out = Path(out_dir)
    problem = folder_problem(out)
    if problem:
        said = f"{out} {problem}" if problem.startswith("is ") else f"{out}: {problem}"
        raise OutDirError(f"{said}; give make_tiny a folder you can write")
    for name in REPLACED:
        folder = out / name
        try:
            if not (folder.exists() or folder.is_symlink()) or made_by_recipe(folder):
                continue
        except OSError as exc:
            raise OutDirError(f"{folder}: cannot look into it ({exc.strerror or exc})") from None
        kind = "a link" if folder.is_symlink() else "a file" if not folder.is_dir() else "a folder with files"
        raise OutDirError(f"{folder} is {kind} that recipe-apo did not make (no {MADE_MARK} in it), and make_tiny "
                          f"would replace it: write the tiny model elsewhere, or remove {folder} yourself")
    return out


def _remove_made(folder: Path) -> None:
    """Remove a folder make_tiny made (checked again here: never anything else)."""
    if not (folder.exists() or folder.is_symlink()):
        return
    if not made_by_recipe(folder):
        raise OutDirError(f"{folder} was not made by recipe-apo: not removed")
    shutil.rmtree(folder)


def _check_count(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"make_tiny: {name} must be an integer >= {minimum}, got {value!r}")


def make_tiny(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    n_train: int = 256,
    n_val: int = 32,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    progress: Progress = print,
) -> dict[str, Path]:
    """Write the tiny model and dataset under ``out_dir``; return ``{"model", "train", "val", "reward"}`` paths.

    ``n_train``/``n_val`` rows (at least 2 each, so both data sources appear), ``warmup_steps`` supervised
    steps on the train rows (0: random weights), everything derived from ``seed``. ``progress`` gets one line
    per stage (None: silent).
    """
    _check_count("seed", seed, 0)
    _check_count("n_train", n_train, 2)
    _check_count("n_val", n_val, 2)
    _check_count("warmup_steps", warmup_steps, 0)
    out = check_out_dir(out_dir)  # before anything is built: a refused folder costs nothing
    say = progress or (lambda _line: None)
    started = time.perf_counter()

    train_rows, val_rows = task_rows("train", n_train, seed), task_rows("val", n_val, seed)
    if not out.exists():
        out.mkdir(parents=True)
        _mark(out)
    # Build into a scratch folder and swap it in, so a failed run leaves the previous output intact.
    scratch = out / SCRATCH
    _remove_made(scratch)
    scratch.mkdir()
    _mark(scratch)
    _write_parquet(train_rows, scratch / "data" / "train.parquet")
    _write_parquet(val_rows, scratch / "data" / "val.parquet")
    _mark(scratch / "data")

    tokenizer = build_tokenizer(train_rows + val_rows)
    model = build_model(tokenizer, seed)
    say(f"make_tiny: vocab {len(tokenizer)}, {sum(p.numel() for p in model.parameters())} parameters")
    loss = warm_up(model, tokenizer, train_rows, warmup_steps, seed)
    if loss is not None:
        say(f"make_tiny: {warmup_steps} warm-up steps, final answer loss {loss:.3f}")
    model.save_pretrained(scratch / "model")  # safetensors, and generation_config.json
    tokenizer.save_pretrained(scratch / "model")
    _mark(scratch / "model")

    for name in ("model", "data"):
        _remove_made(out / name)
        (scratch / name).rename(out / name)
    (scratch / MADE_MARK).unlink()
    scratch.rmdir()
    say(f"make_tiny: wrote {out} in {time.perf_counter() - started:.1f}s")
    return {
        "model": out / "model",
        "train": out / "data" / "train.parquet",
        "val": out / "data" / "val.parquet",
        "reward": Path(task_reward.__file__).resolve(),
    }


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recipe_apo.cpu.make_tiny", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out_dir", help="folder to write model/ and data/ into (those two are replaced if a make_tiny "
                                        "made them; refused if not)")
    parser.add_argument("--seed", type=_count(0), default=0, help="seed for data, tokenizer and weights (default 0)")
    parser.add_argument(
        "--warmup-steps",
        type=_count(0),
        default=DEFAULT_WARMUP_STEPS,
        help=f"supervised Adam steps before saving; 0 keeps random weights (default {DEFAULT_WARMUP_STEPS})",
    )
    parser.add_argument("--n-train", type=_count(2), default=256, help="train prompts, half per source (default 256)")
    parser.add_argument("--n-val", type=_count(2), default=32, help="val prompts, half per source (default 32)")
    parser.add_argument(
        "--measure",
        type=_count(0),
        default=0,
        metavar="K",
        help="then sample K temperature-1 responses per val prompt and print success rates (default 0: skip)",
    )
    args = parser.parse_args(argv)

    try:
        paths = make_tiny(
            args.out_dir, seed=args.seed, n_train=args.n_train, n_val=args.n_val, warmup_steps=args.warmup_steps
        )
    except OutDirError as exc:  # a folder it cannot write or must not replace: one line, nothing built
        print(f"recipe-apo: error: {exc}", file=sys.stderr)
        return 2
    for key, path in paths.items():
        print(f"{key}: {path}")
    print(
        f"overrides: actor_rollout_ref.model.path={paths['model']} data.train_files={paths['train']} "
        f"data.val_files={paths['val']} reward.custom_reward_function.path={paths['reward']} "
        f"reward.custom_reward_function.name=compute_score data.max_prompt_length=64 data.max_response_length=16"
    )
    if args.measure:
        import pandas as pd
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # What was written, loaded back the way verl loads it.
        model = AutoModelForCausalLM.from_pretrained(paths["model"])
        tokenizer = AutoTokenizer.from_pretrained(paths["model"])
        val_rows = pd.read_parquet(paths["val"]).to_dict("records")
        rates = success_rates(model, tokenizer, val_rows, samples=args.measure)
        print("val success at temperature 1: " + ", ".join(f"{k} {v:.2f}" for k, v in rates.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
