"""``python -m recipe_apo.audit RUN_DIR [RUN_DIR ...]``: where each run's learning signal goes, and what GRPO,
Dr. GRPO and APO would have done with the same rollouts (the recipe's presets that a replay from scores alone can
run: ``recipe_apo.audit.stats.preset_methods``).

RUN_DIR is a run's ``trainer.rollout_data_dir`` (one ``<step>.jsonl`` per step) or a recipe run's checkpoint
folder (its ``rollouts/``). Several RUN_DIRs are compared side by side. Writes ``report.md``, ``audit.png`` and
``audit.json`` into ``--out`` and prints where.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from recipe_apo.audit.dumps import AuditError
from recipe_apo.errors import RecipeError


def _apo_settings(pairs: Sequence[str]) -> dict:
    import yaml

    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise AuditError(f"--apo {pair!r}: expected KEY=VALUE, e.g. --apo lambda_scale=2.0")
        settings[key.removeprefix("algorithm.apo.")] = yaml.safe_load(value)
    return settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recipe_apo.audit", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="rollout dump folders, one per run")
    parser.add_argument("--out", default="audit", help="output folder (default: ./audit)")
    parser.add_argument("--name", action="append", default=[], help="a run's name in the report (repeat, in order)")
    parser.add_argument("--tokenizer", default=None,
                        help="model or tokenizer folder: count tokens when the dump has no token lengths")
    parser.add_argument("--max-response-length", type=int, default=None,
                        help="the runs' length cap (data.max_response_length), to tell truncation from token "
                             "lengths when the dump does not record it")
    parser.add_argument("--apo", action="append", default=[], metavar="KEY=VALUE",
                        help="algorithm.apo setting of APO's replay (default: the recipe's defaults)")
    parser.add_argument("--no-plot", action="store_true", help="tables only")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from recipe_apo.audit.report import audit_folders

        apo = _apo_settings(args.apo)
        tokenizer = None
        if args.tokenizer:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        paths = audit_folders(args.runs, Path(args.out), args.name, tokenizer, args.max_response_length, apo,
                              plots=not args.no_plot, say=lambda line: print(line, file=sys.stderr, flush=True))
    except RecipeError as exc:  # a dump, a setting or a batch at fault: said in one line
        print(f"recipe-apo audit: error: {exc}", file=sys.stderr)
        return 2
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    from recipe_apo.integration import quiet

    quiet.install()  # verl's warnings about the accelerators and engines a CPU has not (integration/quiet.py)
    sys.exit(main())
