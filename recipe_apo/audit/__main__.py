"""``python -m recipe_apo.audit RUN_DIR [RUN_DIR ...]``: where each run's learning signal goes, and what GRPO,
Dr. GRPO and APO would have done with the same rollouts (the recipe's presets that a replay from scores alone can
run: ``recipe_apo.integration.replay.preset_methods``).

RUN_DIR is a run's ``trainer.rollout_data_dir`` (one ``<step>.jsonl`` per step) or a recipe run's checkpoint
folder (its ``rollouts/``). Several RUN_DIRs are compared side by side. Writes ``report.md``, ``audit.png`` and
``audit.json`` into ``--out`` and prints where.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

from recipe_apo.audit.dumps import MAX_LENGTH, AuditError, cut_short
from recipe_apo.errors import RecipeError

# The longest --apo KEY=VALUE taken: APO's settings are numbers, flags and names, none spelled in more than a
# few dozen characters (see _apo_settings).
MAX_APO_PAIR = 200


def _apo_settings(pairs: Sequence[str]) -> dict:
    """``--apo KEY=VALUE`` pairs as ``algorithm.apo`` settings, each value read as verl's command line reads
    it (Hydra's grammar: ``eta=1e-3`` is a number, ``reweight=false`` a boolean, ``reweight='false'`` a string)
    and the whole checked by APO's own settings, before any dump is read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from recipe_apo.methods.apo.settings import ApoSettings

    parser, settings = OverridesParser.create(), {}
    for pair in pairs:
        shown = cut_short(repr(pair))
        # Bounded before Hydra's parser, whose time and recursion grow with the text ("[[[[..." nests).
        if len(pair) > MAX_APO_PAIR:
            raise AuditError(f"--apo {shown}: {len(pair)} characters, longer than any KEY=VALUE of algorithm.apo "
                             f"(at most {MAX_APO_PAIR})")
        try:
            override = parser.parse_override(pair)
        except HydraException as exc:
            raise AuditError(f"--apo {shown}: expected KEY=VALUE, e.g. --apo lambda_scale=2.0 "
                             f"({cut_short(str(exc).splitlines()[0], 120)})") from None
        except (ValueError, RecursionError):  # Hydra's int() of 4301 digits and more, nesting too deep
            raise AuditError(f"--apo {shown}: a value Hydra cannot read as a number or a list") from None
        key = override.key_or_group.removeprefix("algorithm.apo.")
        if override.is_sweep_override() or override.is_delete() or not key:  # one replay takes one value
            raise AuditError(f"--apo {shown}: expected one KEY=VALUE, e.g. --apo lambda_scale=2.0")
        if key in settings:
            raise AuditError(f"--apo {key} given twice")
        settings[key] = override.value()
    try:
        ApoSettings.from_algorithm_config({"apo": settings})
    except RecipeError as exc:
        raise AuditError(f"--apo: {exc}") from None
    return settings


def _tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # transformers and huggingface_hub raise many kinds (OSError, ValueError, ...)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if not Path(name).exists():
            raise AuditError(f"--tokenizer {name}: no such folder, nor a model id that loads ({reason})") from None
        raise AuditError(f"--tokenizer {name}: no tokenizer loads from it ({reason})") from None


def _token_cap(text: str) -> int:
    """``--max-response-length``: ASCII digits (no ``1e3``, no ``1.5``), from 1 to 2^53, the dump's own bound
    on a length (a cap above every length a response can have tells nothing). Bounded as written, before
    int(), which refuses 4301 digits and more."""
    digits = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", digits):
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, got {cut_short(repr(text))}")
    significant = digits.lstrip("+-").lstrip("0") or "0"
    if digits.startswith("-") and significant != "0":
        raise argparse.ArgumentTypeError(f"must be >= 1, got {cut_short(digits)}")
    if len(significant) > len(str(MAX_LENGTH)) or int(significant) > MAX_LENGTH:
        raise argparse.ArgumentTypeError(f"must be at most 2^53 (no response is longer), got {cut_short(digits)}")
    value = int(significant)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # said as the audit's one line, like every other refusal
        raise AuditError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m recipe_apo.audit", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="rollout dump folders, one per run")
    parser.add_argument("--out", default="audit", help="output folder (default: ./audit)")
    parser.add_argument("--name", action="append", default=[],
                        help="a run's name in the report (once per RUN_DIR, in order)")
    parser.add_argument("--tokenizer", default=None,
                        help="model or tokenizer folder: count tokens when the dump has no token lengths")
    parser.add_argument("--max-response-length", type=_token_cap, default=None,
                        help="the runs' length cap (data.max_response_length), to tell truncation from token "
                             "lengths when the dump does not record it")
    parser.add_argument("--apo", action="append", default=[], metavar="KEY=VALUE",
                        help="algorithm.apo setting of APO's replay (default: the recipe's defaults)")
    parser.add_argument("--no-plot", action="store_true", help="tables only")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        from recipe_apo.audit.report import audit_folders, check_out_folder

        # Every argument is checked before the first dump is read (a long read must not end on a typo).
        check_out_folder(Path(args.out))
        apo = _apo_settings(args.apo)
        tokenizer = _tokenizer(args.tokenizer) if args.tokenizer else None
        paths = audit_folders(args.runs, Path(args.out), args.name, tokenizer, args.max_response_length, apo,
                              plots=not args.no_plot, say=lambda line: print(line, file=sys.stderr, flush=True))
    except RecipeError as exc:  # a dump, an argument or a setting at fault: said in one line
        print(f"recipe-apo audit: error: {exc}", file=sys.stderr)
        return 2
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    from recipe_apo.integration import quiet

    quiet.install()  # verl's warnings about the accelerators and engines a CPU has not (integration/quiet.py)
    sys.exit(main())
