#!/usr/bin/env python
"""R2PO's model files: give a plain model the rollout head R2PO trains, or take it off for inference.

    python scripts/r2po_head.py add Qwen2.5-Math-1.5B/ models/qwen-r2po      # the model method=r2po trains
    python scripts/r2po_head.py add --seed 1 --std 1e-6 <model> <folder>     # reset_adaptor's start instead
    python scripts/r2po_head.py strip <merged checkpoint> models/qwen-kept   # pi_base: the model users keep

``add`` writes ``<folder>``: the model's weights and tokenizer files with ``rollout_head.layer1`` (d x d) and
``rollout_head.layer2`` (V x d) drawn from N(0, std^2) (default 0.02, the released script's effective start:
transformers' draw of the weights its checkpoint lacks; its ``reset_adaptor``, never called, draws 1e-6), its
``architectures`` ``R2PO<Base>`` (Qwen2, Qwen3 and Llama families); the launch makes the same copy (seed 0). It
refuses a model that holds a head already, by its architecture or by its ``rollout_head.*`` weights (a merged
checkpoint: a fresh draw would replace the trained head), and a std whose draw is not finite in the model's dtype.
``strip`` writes the same model without the head, its ``architectures`` the family's own: what vLLM, transformers
or verl's evaluation then load as any model.
A training checkpoint's actor is FSDP shards: merge it first with verl's model merger
(``python -m verl.model_merger merge --backend fsdp --local_dir <step>/actor --target_dir <merged>``), which writes
the head's weights under the family's own architecture (transformers would drop them silently on load); ``strip``
takes that folder too (docs/beside_apo.md).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Iterator

from recipe_apo.methods.r2po.model import INIT_STD, RolloutHeadError, add_rollout_head, strip_rollout_head


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python scripts/r2po_head.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="a copy of a plain model with a fresh rollout head")
    add.add_argument("source", type=Path, help="a plain model folder (config.json, weights, tokenizer)")
    add.add_argument("target", type=Path, help="the folder to write (new, or empty)")
    add.add_argument("--seed", type=int, default=0, help="seed of the head's draw (default 0)")
    add.add_argument("--std", type=float, default=INIT_STD, help=f"std of the head's weights (default {INIT_STD:g})")
    strip = commands.add_parser("strip", help="a copy of a rollout-head model without its head (pi_base)")
    strip.add_argument("source", type=Path, help="a rollout-head model folder (merged, Hugging Face layout)")
    strip.add_argument("target", type=Path, help="the folder to write (new, or empty)")
    return parser


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars and load reports off while held: the head a plain model lacks is reported
    missing at every load (the script draws it next), and a refusal is one line."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.target.exists() and (not args.target.is_dir() or any(args.target.iterdir())):
        print(f"r2po_head: {args.target} exists and is not an empty folder; name a new one", file=sys.stderr)
        return 2
    if not args.source.is_dir():
        print(f"r2po_head: {args.source} is not a model folder", file=sys.stderr)
        return 2
    if args.command == "add" and not 0.0 < args.std < float("inf"):
        print(f"r2po_head: --std must be a finite number > 0, got {args.std}", file=sys.stderr)
        return 2
    try:
        with quiet_transformers():
            out = _run(args)
    except (RolloutHeadError, OSError) as exc:
        print(f"r2po_head: {exc}", file=sys.stderr)
        return 1
    print(f"r2po_head: wrote {out}")
    return 0


def _run(args: argparse.Namespace) -> Path:
    if args.command == "add":
        return add_rollout_head(args.source, args.target, seed=args.seed, std=args.std)
    return strip_rollout_head(args.source, args.target)


if __name__ == "__main__":
    sys.exit(main())
