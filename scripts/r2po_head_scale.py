#!/usr/bin/env python
"""How far R2PO's rollout head moves pi_roll from pi_base, on a real model's own hidden states: at its start, and
after a head phase's Adam updates at a given learning rate (the figures of docs/beside_apo.md, "The head's start").

    python scripts/r2po_head_scale.py ~/.cache/recipe_apo/smollm2-135m-instruct              # about 9 min, 2 cores
    python scripts/r2po_head_scale.py <model> --std 0.02 1e-6 --lr 1e-6 2e-5 1e-4 1e-3 --updates 10

It samples ``--samples`` responses to each of ``--prompts`` arithmetic questions from the model (seeded,
temperature 1, up to ``--max-new-tokens``), keeps the final hidden states h and base logits z of every response
token (the base model does not change in a head phase), and prints, as markdown:

1. the start: for each ``--std``, delta = W2 ReLU(W1 h) with both matrices drawn from N(0, std^2); its std against
   s^2 sqrt(d/2) |h| (what the draw predicts), the mean over response tokens of KL(pi_roll || pi_base) and of the
   range max_v delta - min_v delta (``recipe_apo.methods.r2po.model.head_gap_rows``), and the share of the logits
   that adding delta in bfloat16 changes at all;
2. the bound: from reset_adaptor's 1e-6, every weight at most 1e-6 + k lr after k Adam updates of nominal step lr,
   so |delta_v| <= d (1e-6 + k lr)^2 |h|_1 (the largest |h|_1 of the tokens);
3. the updates: from each start, ``--updates`` AdamW updates (verl's defaults: betas (0.9, 0.999), weight decay
   0.01) of the head alone on the head phase's loss, the per-response token mean of -A ratio + 0.04 k3(pi_base,
   pi_roll), with A = +1 and -1 on alternate responses and the same batch every update: the most coherent
   direction a phase can have, so the head moves at least as far as in a run. Each row: the KL and the range after
   1 and after the last update, and |delta_k - delta_0| / |delta_0|.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from recipe_apo.methods.r2po.model import INIT_STD, RESET_STD, RolloutHeadError, head_gap_rows, residual_class

QUESTIONS = ("What is 3 + 5?", "Calculate 7 - 2.", "What is 9 + 4?", "Compute 6 - 8.", "What is 8 - 3 + 1?",
             "Find 5 + 7.", "What is 4 - 9?", "Solve 2 + 2 + 1.")
KL_COEF = 0.04      # the preset's kl_loss_coef
BOUND_UPDATES = (10, 20, 200)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python scripts/r2po_head_scale.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a model folder of a family with a rollout-head class")
    parser.add_argument("--std", type=float, nargs="+", default=[INIT_STD, RESET_STD], help="starts to compare")
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-6, 2e-5, 1e-4, 1e-3], help="head learning rates")
    parser.add_argument("--updates", type=int, default=10, help="Adam updates of a head phase (default 10: the "
                                                                "released script's 20 head steps)")
    parser.add_argument("--prompts", type=int, default=2, help=f"questions, at most {len(QUESTIONS)} (default 2)")
    parser.add_argument("--samples", type=int, default=8, help="responses per question (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def load(folder: Path):
    """The model with a rollout head (a plain model gains one), its tokenizer, fp32, evaluation mode."""
    import json

    from transformers import AutoConfig, AutoTokenizer

    try:
        model_type = json.loads((folder / "config.json").read_text())["model_type"]
    except (OSError, ValueError, KeyError) as exc:
        raise RolloutHeadError(f"{folder}: no readable config.json with a model_type ({exc})") from exc
    cls = residual_class(model_type)
    config = AutoConfig.from_pretrained(folder)
    config.architectures = [cls.__name__]
    model = cls.from_pretrained(folder, config=config, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)


@torch.no_grad()
def response_states(model, tokenizer, prompts: int, samples: int, max_new_tokens: int, seed: int):
    """(h, z, tokens, response of each token) at every response token's position, sampled from pi_base."""
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True) for q in QUESTIONS[:prompts]]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    torch.manual_seed(seed)
    with model.select_logits_head("base"):
        sequences = model.generate(**encoded, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                   max_new_tokens=max_new_tokens, num_return_sequences=samples, pad_token_id=pad)
        prompt_len = encoded["input_ids"].shape[1]
        responses = sequences[:, prompt_len:]
        ended = (responses == tokenizer.eos_token_id).long().cumsum(dim=1)
        mask = (ended == 0) | ((ended == 1) & (responses == tokenizer.eos_token_id))  # up to the end token
        attention = torch.cat([encoded["attention_mask"].repeat_interleave(samples, 0), mask.long()], dim=1)
        hidden = model.model(input_ids=sequences, attention_mask=attention).last_hidden_state
        hidden = hidden[:, prompt_len - 1:-1][mask]
        rows = torch.arange(responses.shape[0]).unsqueeze(1).expand_as(responses)[mask]
        return hidden, model.get_output_embeddings()(hidden), responses[mask], rows


def start_rows(model, hidden, base, stds, seed) -> list[str]:
    d, norms = hidden.shape[-1], hidden.norm(dim=-1)
    lines = ["| start std | delta std | s^2 sqrt(d/2) |h| | KL(pi_roll \\|\\| pi_base) | range of delta | "
             "logits a bf16 sum changes |", "|---|---|---|---|---|---|"]
    with torch.no_grad():
        for std in stds:
            model.rollout_head.reset(std, torch.Generator().manual_seed(seed))
            delta = model.rollout_head(hidden)
            kl, spread = head_gap_rows(base, base + delta)
            z16 = base.bfloat16()
            changed = ((z16 + delta.bfloat16()) != z16).float().mean()
            predicted = std ** 2 * math.sqrt(d / 2) * norms.mean()
            lines.append(f"| {std:g} | {delta.std():.3g} | {predicted:.3g} | {kl.mean():.3g} | {spread.mean():.3g} | "
                         f"{changed:.3f} |")
    return lines


def bound_rows(hidden, lrs) -> list[str]:
    d, l1 = hidden.shape[-1], float(hidden.abs().sum(dim=-1).max())
    lines = ["| lr | " + " | ".join(f"after {k}" for k in BOUND_UPDATES) + " |",
             "|---|" + "---|" * len(BOUND_UPDATES)]
    for lr in lrs:
        lines.append(f"| {lr:g} | " + " | ".join(f"{d * (RESET_STD + k * lr) ** 2 * l1:.3g}" for k in BOUND_UPDATES)
                     + " |")
    return lines


def update_rows(model, hidden, base, tokens, rows, stds, lrs, updates, seed) -> list[str]:
    responses = int(rows.max()) + 1
    counts = torch.bincount(rows, minlength=responses).float()
    advantage = torch.where(rows % 2 == 0, 1.0, -1.0)
    ref = torch.log_softmax(base, dim=-1).gather(1, tokens[:, None]).squeeze(1)  # pi_base, the reference
    head = model.rollout_head
    lines = ["| start std | lr | KL after 1 | KL after last | range after 1 | range after last | delta moved |",
             "|---|---|---|---|---|---|---|"]
    for std in stds:
        for lr in lrs:
            head.reset(std, torch.Generator().manual_seed(seed))
            optimizer = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
            with torch.no_grad():
                first = head(hidden)
            seen = {}
            for k in range(1, updates + 1):
                log_prob = torch.log_softmax(base + head(hidden), dim=-1).gather(1, tokens[:, None]).squeeze(1)
                ratio = torch.exp(log_prob - log_prob.detach())
                k3 = torch.exp(ref - log_prob) - (ref - log_prob) - 1
                per_token = -ratio * advantage + KL_COEF * k3
                loss = (torch.zeros(responses).index_add(0, rows, per_token) / counts).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if k in (1, updates):
                    with torch.no_grad():
                        delta = head(hidden)
                        kl, spread = head_gap_rows(base, base + delta)
                        moved = (delta - first).norm() / first.norm().clamp_min(1e-30)
                    seen[k] = (float(kl.mean()), float(spread.mean()), float(moved))
            lines.append(f"| {std:g} | {lr:g} | {seen[1][0]:.3g} | {seen[updates][0]:.3g} | {seen[1][1]:.3g} | "
                         f"{seen[updates][1]:.3g} | {seen[updates][2]:.3g} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.prompts <= len(QUESTIONS) or args.samples < 2 or args.updates < 1 or args.max_new_tokens < 1:
        print(f"r2po_head_scale: --prompts in [1, {len(QUESTIONS)}], --samples >= 2, --updates >= 1 and "
              "--max-new-tokens >= 1", file=sys.stderr)
        return 2
    if any(not 0 < value < math.inf for value in (*args.std, *args.lr)):
        print("r2po_head_scale: every --std and --lr must be a finite number > 0", file=sys.stderr)
        return 2
    if not args.model.is_dir():
        print(f"r2po_head_scale: {args.model} is not a model folder", file=sys.stderr)
        return 2
    try:
        model, tokenizer = load(args.model)
    except (RolloutHeadError, OSError) as exc:
        print(f"r2po_head_scale: {exc}", file=sys.stderr)
        return 1
    hidden, base, tokens, rows = response_states(model, tokenizer, args.prompts, args.samples, args.max_new_tokens,
                                                 args.seed)
    norms = hidden.norm(dim=-1)
    print(f"{args.model}: d {hidden.shape[-1]}, V {base.shape[-1]}, {hidden.shape[0]} response tokens of "
          f"{int(rows.max()) + 1} responses; |h| mean {norms.mean():.3g}, |h|_1 max "
          f"{hidden.abs().sum(dim=-1).max():.4g}; |z| mean {base.abs().mean():.3g}\n")
    print("\n".join(["The start", "", *start_rows(model, hidden, base, args.std, args.seed), "",
                     "The bound on |delta_v| from reset_adaptor's 1e-6", "", *bound_rows(hidden, args.lr), "",
                     f"{args.updates} head-phase updates", "",
                     *update_rows(model, hidden, base, tokens, rows, args.std, args.lr, args.updates, args.seed)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
