"""How much of a model one AdamW step changes, float32 weights (the reference) vs bfloat16 weights.

For each model and learning rate: load the weights in float32 and in bfloat16, run one language-model loss on a
fixed batch under bfloat16 autocast (what ``bf16=True`` does on a GPU, here on the CPU), clip the gradient norm to
1 and take one AdamW step with RAGEN's actor settings (betas 0.9/0.999, weight decay 0.01); then count the
trainable elements whose value changed at all (bit-exact) and the mean absolute change. The bfloat16 row is
reported against the float32 row of the same run (ratios), so the machine's speed does not enter.

    python benchmarks/update_precision.py                 # tiny random Qwen2 and SmolLM2-135M, lr 1e-6 and 1e-5
    python benchmarks/update_precision.py --quick         # tiny model, lr 1e-6 (seconds; tested)
    python benchmarks/update_precision.py --model PATH    # any local causal LM folder

Nothing is written unless ``--json PATH`` is given; results are recorded by hand in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

import _offline  # noqa: F401  (offline env vars and repo path, before any torch import)

TEXT = (
    "<think>The box is left of the target, so I push it right.</think><answer>Right || Right</answer> "
    "Turn 2: State: #######\n#_P_X_O#\n####### You have 8 actions left."
)


def one_step(path: str, dtype_name: str, lr: float, *, seed: int = 0) -> dict[str, float]:
    """The fraction of trainable elements one step changes, and their mean absolute change."""
    import torch
    from llm_gym.trainer.precision import changed_fraction, trainable_snapshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype_name))
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok([TEXT, TEXT[::-1]], return_tensors="pt", padding=True).input_ids
    before = trainable_snapshot(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.01)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    params = dict(model.named_parameters())
    total = sum(t.numel() for t in before.values())
    moved = sum(float((params[n].detach().float() - t.float()).abs().sum()) for n, t in before.items())
    return {"changed": changed_fraction(model, before), "mean_abs_change": moved / total, "elements": total}


def models(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.model:
        return [(args.model, args.model)]
    from tests._tiny import build_tiny_model

    out = [("tiny Qwen2 (100k)", build_tiny_model(tempfile.mkdtemp(prefix="update_precision_")))]
    if not args.quick:
        from llm_gym.trainer.models import smollm2_dir

        out.append(("SmolLM2-135M", str(smollm2_dir())))
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    lrs = [1e-6] if args.quick else args.lr
    for name, path in models(args):
        for lr in lrs:
            ref = one_step(path, "float32", lr)
            low = one_step(path, "bfloat16", lr)
            rows.append(
                {
                    "model": name,
                    "lr": lr,
                    "float32_changed": ref["changed"],
                    "bfloat16_changed": low["changed"],
                    "changed_ratio": low["changed"] / ref["changed"],
                    "mean_abs_change_ratio": ref["mean_abs_change"] / max(low["mean_abs_change"], 1e-30),
                    "elements": ref["elements"],
                }
            )
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'model':<20}{'lr':>8}{'fp32 changed':>14}{'bf16 changed':>14}{'bf16/fp32':>11}{'|dw| fp32/bf16':>16}"
    ]
    for r in rows:
        lines.append(
            f"{r['model']:<20}{r['lr']:>8.0e}{r['float32_changed']:>14.2%}{r['bfloat16_changed']:>14.2%}"
            f"{r['changed_ratio']:>11.3f}{r['mean_abs_change_ratio']:>15.1f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, lr 1e-6 only")
    ap.add_argument(
        "--model", default=None, help="a local causal LM folder instead of the tiny model and SmolLM2"
    )
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-6, 1e-5], help="learning rates")
    ap.add_argument("--json", default=None, help="also write the rows as JSON to this path")
    args = ap.parse_args(argv)
    rows = run(args)
    print(format_rows(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
