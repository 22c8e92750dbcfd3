#!/usr/bin/env python
"""Write the paper's training and evaluation sets as verl parquet files.

    python scripts/prepare_data.py --out-dir ~/data/recipe_apo                  # from the Hugging Face hub
    python scripts/prepare_data.py --drgrpo-dir understand-r1-zero/datasets     # Dr. GRPO's own copies
    python scripts/prepare_data.py --file aime24=aime.jsonl --file amc=amc.parquet ...   # local files
    python scripts/prepare_data.py --splits gsm8k                               # GSM8K for the small run
    python scripts/prepare_data.py --splits arithmetic --part test --seed 3 --size 100 --out-dir data/test
                                                                    # reasoning-gym, offline (make real)

Splits (``--splits paper``, the default): the training set ``math_lvl3to5`` (MATH levels 3-5, 8,523 problems)
and the evaluation sets ``aime24`` (30), ``amc`` (83), ``math500`` (500), ``minerva`` (272) and
``olympiadbench`` (675). ``--splits gsm8k``: ``gsm8k_train`` (7,473) and ``gsm8k_test`` (1,319).
Each becomes ``<out-dir>/<split>.parquet``.

Every row is in the layout of verl's own ``examples/data_preprocess`` files, so verl's ``RLHFDataset`` reads
it and verl's GSM8K/MATH parquet files stay interchangeable with these::

    data_source   the split name (verl groups validation metrics by it: val-core/<data_source>/...)
    prompt        [{"role": "system", "content": QWEN_MATH_SYSTEM}, {"role": "user", "content": <problem>}]
    ability       "math"
    reward_model  {"style": "rule", "ground_truth": <final answer>}
    extra_info    {"split", "index", "benchmark", "source", "answers": [all accepted forms], "level", "subject"}

The prompt is the Qwen-Math template Dr. GRPO trained and evaluated with (``apply_qwen_math_template`` in
sail-sg/understand-r1-zero): Qwen2.5(-Math)'s chat template renders these two messages to exactly
``<|im_start|>system\\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\\n
<|im_start|>user\\n{problem}<|im_end|>\\n<|im_start|>assistant\\n``.

``--splits arithmetic``: two levels of reasoning-gym's ``basic_arithmetic``, generated offline (the extra ``real``),
one file and one ``data_source`` each: ``gym_add_1digit`` (a + b, one digit each: reasoning-gym draws 0-10) and
``gym_addsub_1digit`` (a + b or a - b, one digit each: half the answers are negative or zero). The prompt is the
system message ``GYM_SYSTEM`` and the question; the reward is the response's last number checked by reasoning-gym's
own checker (``recipe_apo/reward/gym_answer.py``). The two levels and the prompt were chosen by measurement on
SmolLM2-135M-Instruct (docs/real.md): its pass@1 at temperature 1 is about 30% and 20% (two digits: below 10%).
``--part train|val|test`` takes the problems whose ``sha256(question) mod 10`` is 0-5, 6-7 or 8-9, so the three
parts never share a problem whatever the seeds; ``--seed`` seeds the generator (each part offsets it, so parts also
come from disjoint seeds), ``--size`` is the problems per level (distinct within a file; a level whose part holds
fewer, such as the 121 sums of one-digit numbers, gives all it has and says so).

Row counts are checked against the paper's; a split whose count differs is not written (exit status 1)
unless ``--allow-partial`` is given.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

# Tried in order when a source does not name its columns. Never "input": Dr. GRPO's and SimpleRL's "input"
# columns already have a prompt template applied.
QUESTION_KEYS = ("problem", "question", "Problem", "Question")
ANSWER_KEYS = ("answer", "gt_answer", "final_answer", "ground_truth", "Answer", "solution")


@dataclass(frozen=True)
class HubSource:
    path: str
    name: Optional[str] = None
    split: str = "train"
    data_files: Optional[str] = None
    question_key: Optional[str] = None
    answer_key: Optional[str] = None

    def describe(self) -> str:
        parts = [self.path]
        if self.name:
            parts.append(self.name)
        if self.data_files:
            parts.append(self.data_files)
        return ":".join(parts) + f" [{self.split}]"


@dataclass(frozen=True)
class SplitSpec:
    name: str
    role: str  # "train" or "test"
    expected_rows: int
    hub: HubSource
    # Path inside Dr. GRPO's repository folder `datasets/` (datasets.save_to_disk layout).
    drgrpo_path: Optional[str]
    description: str
    answer_fn: Optional[Callable[[Any], Any]] = field(default=None, compare=False)


def _gsm8k_answer(answer: Any) -> Any:
    # "...reasoning...\n#### 1,234" -> "1234", as verl's gsm8k preprocessing extracts it.
    if isinstance(answer, str) and "####" in answer:
        return answer.split("####")[-1].strip().replace(",", "")
    return answer


SPLITS: dict[str, SplitSpec] = {
    spec.name: spec
    for spec in (
        SplitSpec(
            "math_lvl3to5", "train", 8523,
            # SimpleRL-Zoo's MATH level 3-5 set. Dr. GRPO's `math_lvl3to5_8k` has SimpleRL's columns
            # (question, gt_answer, level, subject, ...); that the hub copy is the same 8,523 problems is what
            # the row count below checks.
            HubSource("hkust-nlp/SimpleRL-Zoo-Data", split="train",
                      data_files="simplelr_qwen_level3to5/train.parquet",
                      question_key="question", answer_key="gt_answer"),
            "train/math_lvl3to5_8k/train",
            "MATH levels 3-5 (training)",
        ),
        SplitSpec("aime24", "test", 30, HubSource("HuggingFaceH4/aime_2024", split="train",
                                                  question_key="problem", answer_key="answer"),
                  "evaluation_suite/aime", "AIME 2024"),
        SplitSpec("amc", "test", 83, HubSource("AI-MO/aimo-validation-amc", split="train",
                                               question_key="problem", answer_key="answer"),
                  "evaluation_suite/amc", "AMC 2022-2023"),
        SplitSpec("math500", "test", 500, HubSource("HuggingFaceH4/MATH-500", split="test",
                                                    question_key="problem", answer_key="answer"),
                  "evaluation_suite/math", "MATH500"),
        SplitSpec("minerva", "test", 272, HubSource("math-ai/minervamath", split="test",
                                                    question_key="question", answer_key="answer"),
                  "evaluation_suite/minerva", "Minerva Math"),
        SplitSpec("olympiadbench", "test", 675, HubSource("Hothan/OlympiadBench", name="OE_TO_maths_en_COMP",
                                                          split="train", question_key="question",
                                                          answer_key="final_answer"),
                  "evaluation_suite/olympiad_bench", "OlympiadBench (English, text-only maths, competition)"),
        SplitSpec("gsm8k_train", "train", 7473, HubSource("openai/gsm8k", name="main", split="train",
                                                          question_key="question", answer_key="answer"),
                  None, "GSM8K train", answer_fn=_gsm8k_answer),
        SplitSpec("gsm8k_test", "test", 1319, HubSource("openai/gsm8k", name="main", split="test",
                                                        question_key="question", answer_key="answer"),
                  None, "GSM8K test", answer_fn=_gsm8k_answer),
    )
}

SPLIT_GROUPS = {
    "paper": ("math_lvl3to5", "aime24", "amc", "math500", "minerva", "olympiadbench"),
    "eval": ("aime24", "amc", "math500", "minerva", "olympiadbench"),
    "gsm8k": ("gsm8k_train", "gsm8k_test"),
}
SPLIT_GROUPS["all"] = SPLIT_GROUPS["paper"] + SPLIT_GROUPS["gsm8k"]


# --------------------------------------------------------------------------------------------------------------
# reasoning-gym: verifiable tasks generated offline (scripts/prepare_data.py --splits arithmetic)
# --------------------------------------------------------------------------------------------------------------

# Chosen by measurement (docs/real.md): with it SmolLM2-135M-Instruct answers in a sentence or a number; with its
# default system prompt it rambles past the length cap more often.
GYM_SYSTEM = "You are a calculator. Reply with the result only."
# Buckets of sha256(question) mod 10 that make each part: the parts never share a problem.
GYM_PARTS = {"train": range(0, 6), "val": range(6, 8), "test": range(8, 10)}
# Added to --seed per part, so the parts are drawn from disjoint seeds as well.
GYM_SEED_OFFSET = {"train": 0, "val": 1_000_003, "test": 2_000_006}
# Draws per wanted problem before a level counts as exhausted (its part holds fewer distinct problems).
GYM_DRAWS = 40


@dataclass(frozen=True)
class GymSpec:
    """One level of a reasoning-gym generator: its file, ``data_source`` and the generator's settings."""

    name: str
    generator: str
    config: tuple  # (key, value) pairs of the generator's config
    description: str


GYM_SPLITS: dict[str, GymSpec] = {
    spec.name: spec
    for spec in (
        GymSpec("gym_add_1digit", "basic_arithmetic",
                (("min_terms", 2), ("max_terms", 2), ("min_digits", 1), ("max_digits", 1), ("operators", ("+",)),
                 ("allow_parentheses", False), ("allow_negation", False)),
                "reasoning-gym basic_arithmetic: a + b, one digit each (0-10: 121 problems)"),
        GymSpec("gym_addsub_1digit", "basic_arithmetic",
                (("min_terms", 2), ("max_terms", 2), ("min_digits", 1), ("max_digits", 1), ("operators", ("+", "-")),
                 ("allow_parentheses", False), ("allow_negation", False)),
                "reasoning-gym basic_arithmetic: a + b or a - b, one digit each (0-10: 242 problems)"),
    )
}
SPLIT_GROUPS["arithmetic"] = tuple(GYM_SPLITS)


def _version(distribution: str) -> str:
    from importlib.metadata import version

    return version(distribution)


def gym_bucket(question: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big") % 10


def gym_rows(spec: GymSpec, part: str, seed: int, size: int) -> list[dict]:
    """``size`` distinct problems of ``spec`` in ``part`` (fewer when the part holds fewer), as verl rows."""
    try:
        import reasoning_gym
    except ImportError:
        raise PrepareError(f"{spec.name}: reasoning-gym is not installed (pip install -e \".[real]\")") from None
    buckets = GYM_PARTS[part]
    generator_seed = seed + GYM_SEED_OFFSET[part]
    dataset = reasoning_gym.create_dataset(spec.generator, size=size * GYM_DRAWS, seed=generator_seed,
                                           **dict(spec.config))
    rows: list[dict] = []
    seen: set[str] = set()
    for entry in dataset:
        question = entry["question"]
        if question in seen or gym_bucket(question) not in buckets:
            continue
        seen.add(question)
        rows.append({
            "data_source": spec.name,
            "prompt": [{"role": "system", "content": GYM_SYSTEM}, {"role": "user", "content": question}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(entry["answer"])},
            "extra_info": {
                "split": part, "index": len(rows), "benchmark": spec.name,
                "source": f"reasoning-gym {_version('reasoning-gym')} {spec.generator} seed {generator_seed}",
                "answers": [str(entry["answer"])], "level": spec.name, "subject": spec.generator,
                "reasoning_gym": spec.generator,
                "reasoning_gym_metadata": json.dumps(entry.get("metadata", {}), sort_keys=True, default=str),
            },
        })
        if len(rows) == size:
            break
    return rows


class PrepareError(RuntimeError):
    """A source could not be read or converted; the message says which and why."""


# --------------------------------------------------------------------------------------------------------------
# Reading sources
# --------------------------------------------------------------------------------------------------------------


def read_local(path: str) -> list[dict]:
    """Rows of a local JSON / JSONL / parquet / arrow file, or of a `datasets.save_to_disk` folder; a file that
    cannot be read as its kind (not UTF-8, broken JSON, a corrupt parquet or arrow file) is one ``PrepareError``
    line naming it."""
    import pyarrow as pa

    try:
        return _read_local(path)
    except UnicodeDecodeError as exc:
        raise PrepareError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})") \
            from None
    except (pa.ArrowException, OSError) as exc:
        first = " ".join(str(exc).split())[:160]
        raise PrepareError(f"{path}: cannot be read ({type(exc).__name__}: {first})") from None


def _read_local(path: str) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.expanduser(path)
    if os.path.isdir(path):
        arrow_files = sorted(glob.glob(os.path.join(path, "*.arrow")))
        parquet_files = sorted(glob.glob(os.path.join(path, "*.parquet")))
        files = arrow_files or parquet_files
        if not files:
            raise PrepareError(f"{path}: a folder without .arrow or .parquet files")
        rows: list[dict] = []
        for file in files:
            rows.extend(_read_local(file))
        return rows
    if not os.path.exists(path):
        raise PrepareError(f"{path}: no such file")
    lower = path.lower()
    if lower.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    if lower.endswith(".arrow"):
        # datasets.save_to_disk writes the Arrow stream format; plain Arrow files use the file format.
        try:
            with pa.memory_map(path) as source:
                return pa.ipc.open_stream(source).read_all().to_pylist()
        except pa.ArrowInvalid:
            with pa.memory_map(path) as source:
                return pa.ipc.open_file(source).read_all().to_pylist()
    if lower.endswith((".json", ".jsonl")):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        stripped = text.lstrip()
        if stripped.startswith("["):
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise PrepareError(f"{path}: not a JSON array of rows ({exc})") from None
        elif lower.endswith(".json") and stripped.startswith("{") and _single_json_object(text):
            data = json.loads(text)
            # {"data": [...]} / {"train": [...]}: the one list inside
            lists = [v for v in data.values() if isinstance(v, list)] if isinstance(data, dict) else []
            if len(lists) != 1:
                raise PrepareError(f"{path}: a JSON object without exactly one list of rows inside")
            data = lists[0]
        else:
            data = []
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        data.append(json.loads(line))
                    except ValueError as exc:
                        raise PrepareError(f"{path}:{number}: not a JSON line ({exc})") from None
        if not all(isinstance(row, dict) for row in data):
            raise PrepareError(f"{path}: rows must be JSON objects")
        return data
    raise PrepareError(f"{path}: unknown format (expected .json, .jsonl, .parquet, .arrow or a folder)")


def _single_json_object(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def read_hub(source: HubSource) -> list[dict]:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - verl depends on datasets
        raise PrepareError(f"the `datasets` package is needed to read {source.describe()} ({exc})") from None
    kwargs: dict[str, Any] = {"split": source.split}
    if source.data_files:
        kwargs["data_files"] = source.data_files
    try:
        if source.name:
            dataset = datasets.load_dataset(source.path, source.name, **kwargs)
        else:
            dataset = datasets.load_dataset(source.path, **kwargs)
    except Exception as exc:
        raise PrepareError(
            f"could not load {source.describe()} from the Hugging Face hub ({type(exc).__name__}: {exc}); "
            "without the hub, pass local files with --file NAME=PATH or Dr. GRPO's copies with --drgrpo-dir"
        ) from None
    return [dict(row) for row in dataset]


# --------------------------------------------------------------------------------------------------------------
# Converting rows
# --------------------------------------------------------------------------------------------------------------


def last_boxed(text: str) -> Optional[str]:
    """Content of the last \\boxed{...} of a reference solution (balanced braces)."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for index in range(brace, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : index]
    return None


def answer_text(value: Any) -> str:
    """One accepted answer as the string stored as ground truth ('' when there is none)."""
    if value is None or isinstance(value, bool):
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        return str(int(value)) if value.is_integer() else repr(value)
    if not isinstance(value, str):
        value = str(value)
    value = value.strip()
    if "\\boxed" in value or "\\fbox" in value:
        boxed = last_boxed(value)
        if boxed is not None:
            value = boxed.strip()
    if len(value) >= 2 and value.startswith("$") and value.endswith("$") and not value.endswith("\\$"):
        value = value.strip("$").strip()  # OlympiadBench writes its answers as "$...$"
    return value


def answer_list(value: Any) -> list[str]:
    """Every accepted form of an answer: Minerva and OlympiadBench store lists of equivalent answers."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        answers = [answer_text(item) for item in value]
    else:
        answers = [answer_text(value)]
    unique: list[str] = []
    for answer in answers:
        if answer and answer not in unique:
            unique.append(answer)
    return unique


def _pick(row: dict, preferred: Optional[str], fallbacks: Iterable[str]) -> tuple[Optional[str], Any]:
    if preferred and row.get(preferred) not in (None, ""):
        return preferred, row[preferred]
    for key in fallbacks:
        if row.get(key) not in (None, ""):
            return key, row[key]
    return None, None


def make_prompt(question: str) -> list[dict]:
    return [{"role": "system", "content": QWEN_MATH_SYSTEM}, {"role": "user", "content": question}]


def convert_rows(spec: SplitSpec, rows: list[dict], source_label: str, progress: bool = True) -> tuple[list[dict], int]:
    """verl rows for ``spec``, and how many input rows were dropped (no question or no answer)."""
    hub = spec.hub
    converted: list[dict] = []
    dropped = 0
    if rows:
        columns = sorted({key for row in rows[:50] for key in row})
        q_key, _ = _pick(rows[0], hub.question_key, QUESTION_KEYS)
        a_key, _ = _pick(rows[0], hub.answer_key, ANSWER_KEYS)
        if q_key is None or a_key is None:
            missing = "question" if q_key is None else "answer"
            raise PrepareError(
                f"{spec.name} from {source_label}: no {missing} column among {columns} "
                f"(looked for {', '.join(QUESTION_KEYS if q_key is None else ANSWER_KEYS)})"
            )
    iterator: Iterable[dict] = rows
    if progress:
        iterator = _progress(rows, f"{spec.name:>14}: converting")
    for row in iterator:
        _, question = _pick(row, hub.question_key, QUESTION_KEYS)
        _, answer = _pick(row, hub.answer_key, ANSWER_KEYS)
        if spec.answer_fn is not None:
            answer = spec.answer_fn(answer)
        question = question.strip() if isinstance(question, str) else ""
        answers = answer_list(answer)
        if not question or not answers:
            dropped += 1
            continue
        level = row.get("level", "")
        converted.append(
            {
                "data_source": spec.name,
                "prompt": make_prompt(question),
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answers[0]},
                "extra_info": {
                    "split": spec.role,
                    "index": len(converted),
                    "benchmark": spec.name,
                    "source": source_label,
                    "answers": answers,
                    "level": "" if level is None else str(level),
                    "subject": str(row.get("subject") or row.get("type") or ""),
                },
            }
        )
    return converted, dropped


def _progress(items: list, description: str) -> Iterable:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return items
    # disable=None: a bar on a terminal, nothing in a log file
    return tqdm(items, desc=description, unit="row", leave=False, file=sys.stderr, mininterval=0.5, disable=None)


def parquet_schema(gym: bool = False):
    """The Arrow schema of the files: verl's preprocessing layout (plain `string`s, as `datasets` writes them);
    ``gym``: with reasoning-gym's two fields in ``extra_info``, the generator and its row's metadata (JSON)."""
    import pyarrow as pa

    gym_fields = [("reasoning_gym", pa.string()), ("reasoning_gym_metadata", pa.string())] if gym else []

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("split", pa.string()),
                        ("index", pa.int64()),
                        ("benchmark", pa.string()),
                        ("source", pa.string()),
                        ("answers", pa.list_(pa.string())),
                        ("level", pa.string()),
                        ("subject", pa.string()),
                        *gym_fields,
                    ]
                ),
            ),
        ]
    )


def write_parquet(rows: list[dict], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    gym = bool(rows) and "reasoning_gym" in rows[0]["extra_info"]
    pq.write_table(pa.Table.from_pylist(rows, schema=parquet_schema(gym)), tmp)
    os.replace(tmp, path)  # a reader never sees half a file


# --------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------


def resolve_splits(text: str) -> list[str]:
    names: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        group = SPLIT_GROUPS.get(part, (part,))
        for name in group:
            if name not in SPLITS and name not in GYM_SPLITS:
                known = ", ".join(list(SPLIT_GROUPS) + list(SPLITS) + list(GYM_SPLITS))
                raise PrepareError(f"unknown split {name!r}; known: {known}")
            if name not in names:
                names.append(name)
    return names


def parse_files(items: list[str]) -> dict[str, str]:
    files: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise PrepareError(f"--file expects NAME=PATH, got {item!r}")
        if name not in SPLITS:
            raise PrepareError(f"--file {item}: unknown split {name!r}; known: {', '.join(SPLITS)}")
        files[name] = path
    return files


def drgrpo_root(path: str) -> str:
    path = os.path.expanduser(path)
    nested = os.path.join(path, "datasets")
    return nested if os.path.isdir(nested) and not os.path.isdir(os.path.join(path, "evaluation_suite")) else path


def load_split(spec: SplitSpec, files: dict[str, str], drgrpo_dir: Optional[str]) -> tuple[list[dict], str]:
    if spec.name in files:
        path = files[spec.name]
        return read_local(path), os.path.abspath(os.path.expanduser(path))
    if drgrpo_dir and spec.drgrpo_path:
        path = os.path.join(drgrpo_root(drgrpo_dir), spec.drgrpo_path)
        return read_local(path), f"sail-sg/understand-r1-zero:datasets/{spec.drgrpo_path}"
    print(f"{spec.name:>14}: loading {spec.hub.describe()} from the Hugging Face hub ...", file=sys.stderr, flush=True)
    return read_hub(spec.hub), f"hf:{spec.hub.describe()}"


def _whole(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
        if not minimum <= value <= 10**9:
            raise argparse.ArgumentTypeError(f"must be between {minimum} and 10**9, got {value}")
        return value

    return parse


def _write_gym(spec: GymSpec, args: argparse.Namespace, out_dir: str, summary: list, counter: str) -> bool:
    """Generate and write one reasoning-gym level; whether it was written."""
    print(f"{counter} {spec.name}: {spec.description}, part {args.part}, seed {args.seed}", file=sys.stderr,
          flush=True)
    path = os.path.join(out_dir, f"{spec.name}.parquet")
    try:
        rows = gym_rows(spec, args.part, args.seed, args.size)
        write_parquet(rows, path)
    except PrepareError as exc:
        print(f"{spec.name:>14}: ERROR {exc}", file=sys.stderr, flush=True)
        summary.append((spec.name, "-", 0, args.size, "error", "-"))
        return False
    except OSError as exc:
        print(f"{spec.name:>14}: ERROR cannot write {path} ({exc.strerror or exc})", file=sys.stderr, flush=True)
        summary.append((spec.name, "-", 0, args.size, "error", "-"))
        return False
    status = "ok" if len(rows) == args.size else f"all {len(rows)} of part {args.part}"
    print(f"{spec.name:>14}: {len(rows)} rows -> {path}", file=sys.stderr, flush=True)
    summary.append((spec.name, rows[0]["extra_info"]["source"] if rows else "-", len(rows), args.size, status, path))
    return True


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write the APO paper's training and evaluation sets as verl parquet files.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="splits: " + ", ".join(f"{n} ({s.expected_rows} rows)" for n, s in SPLITS.items())
        + "; groups: " + ", ".join(f"{g}={'+'.join(m)}" for g, m in SPLIT_GROUPS.items()),
    )
    parser.add_argument("--out-dir", default="~/data/recipe_apo", help="where <split>.parquet files go")
    parser.add_argument("--splits", default="paper", help="comma-separated splits or groups (default: paper)")
    parser.add_argument("--file", action="append", default=[], metavar="NAME=PATH",
                        help="read split NAME from a local .json/.jsonl/.parquet/.arrow file or save_to_disk folder")
    parser.add_argument("--drgrpo-dir", default=None,
                        help="the datasets/ folder of a clone of sail-sg/understand-r1-zero (Dr. GRPO's own copies)")
    parser.add_argument("--allow-partial", action="store_true",
                        help="write splits whose row count differs from the paper's (warns instead of failing)")
    parser.add_argument("--part", choices=tuple(GYM_PARTS), default="train",
                        help="reasoning-gym splits: which part of the problems (train, val, test; never sharing a "
                             "problem; default train)")
    parser.add_argument("--seed", type=_whole(0), default=0, help="reasoning-gym splits: the generator's seed")
    parser.add_argument("--size", type=_whole(1), default=256,
                        help="reasoning-gym splits: problems per level (default 256)")
    args = parser.parse_args(argv)

    try:
        names = resolve_splits(args.splits)
        files = parse_files(args.file)
    except PrepareError as exc:
        parser.error(str(exc))
    out_dir = os.path.expanduser(args.out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        parser.error(f"--out-dir {args.out_dir}: a file, not a folder; name a folder for the parquet files")

    summary: list[tuple[str, str, int, int, str, str]] = []
    failed = False
    for position, name in enumerate(names, 1):
        if name in GYM_SPLITS:
            failed |= not _write_gym(GYM_SPLITS[name], args, out_dir, summary, f"[{position}/{len(names)}]")
            continue
        spec = SPLITS[name]
        print(f"[{position}/{len(names)}] {name}: {spec.description}", file=sys.stderr, flush=True)
        try:
            raw, label = load_split(spec, files, args.drgrpo_dir)
            rows, dropped = convert_rows(spec, raw, label)
        except PrepareError as exc:
            print(f"{name:>14}: ERROR {exc}", file=sys.stderr, flush=True)
            summary.append((name, "-", 0, spec.expected_rows, "error", "-"))
            failed = True
            continue
        path = os.path.join(out_dir, f"{name}.parquet")
        note = f" ({dropped} rows without question or answer dropped)" if dropped else ""
        if len(rows) == spec.expected_rows:
            status = "ok"
        elif args.allow_partial:
            status = "partial"
            print(f"{name:>14}: WARNING {len(rows)} rows, the paper uses {spec.expected_rows}{note}; "
                  "written anyway (--allow-partial)", file=sys.stderr, flush=True)
        else:
            status = "count mismatch"
            print(f"{name:>14}: ERROR {len(rows)} rows, the paper uses {spec.expected_rows}{note}; not written "
                  "(--allow-partial writes it anyway)", file=sys.stderr, flush=True)
            summary.append((name, label, len(rows), spec.expected_rows, status, "-"))
            failed = True
            continue
        try:
            write_parquet(rows, path)
        except OSError as exc:
            print(f"{name:>14}: ERROR cannot write {path} ({exc.strerror or exc})", file=sys.stderr, flush=True)
            summary.append((name, label, len(rows), spec.expected_rows, "error", "-"))
            failed = True
            continue
        print(f"{name:>14}: {len(rows)} rows -> {path}{note}", file=sys.stderr, flush=True)
        summary.append((name, label, len(rows), spec.expected_rows, status, path))

    print("\n| split | rows | expected | status | source | file |")
    print("|---|---:|---:|---|---|---|")
    for name, label, count, expected, status, path in summary:
        print(f"| {name} | {count} | {expected} | {status} | {label} | {path} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
