"""Cost of the SNR filter itself as a fraction of the training step (RAGEN-2: < 0.1% of iteration time).

Times ``llm_gym.trainer.signals.decide_round`` with MI off (group scoring, top_p selection, physical row
removal, ``num_items_in_batch`` recomputation, metrics) on a full rollout batch, against the update
of the same unfiltered batch (loss forward+backward+optimizer, through the real trainer) in the same
run; both in process CPU seconds (min of repeats for the filter). The update is only part of a step (rollouts come on top) and the model here is small, so the
fraction printed is an upper bound of the filter's share of a real step.

    OMP_NUM_THREADS=1 python benchmarks/filter_cost.py
    OMP_NUM_THREADS=1 python benchmarks/filter_cost.py --shapes 8x16,32x4,64x2 --completion-len 512
    OMP_NUM_THREADS=1 python benchmarks/filter_cost.py --rule ragen2   # softmax/std/zero groups, copies
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from filter_update_time import build_trainer, filtered, synthetic_batch, update_seconds  # noqa: E402

PAPER_STEP_SECONDS = 65.9  # RAGEN-2 Table 5, Sokoban 3B, 8x16 filtered step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="8x16,32x4,64x2", help="P x G rollout batches (RAGEN-2 Table 5)")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--completion-len", type=int, default=384)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument(
        "--rule",
        choices=["top_p", "ragen2"],
        default="top_p",
        help="top_p: linear variance rule, rows removed; ragen2: the ragen2 profile's filter (softmax over the "
        "std, zero groups included, copies to whole update batches for proportional optimizer steps)",
    )
    a = p.parse_args()
    extra = (
        {"filter_metric": "std", "filter_include_zero": True, "filter_update_steps": "proportional"}
        if a.rule == "ragen2"
        else {}
    )
    strategy = "softmax_top_p" if a.rule == "ragen2" else "top_p"

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(
        f"rows of {a.prompt_len}+{a.completion_len} tokens; update model hidden {a.hidden}, {a.layers} layers"
    )
    print(
        f"{'P x G':>7} {'kept':>5} {'filter ms':>10} {'update s':>9} {'filter/update':>14} {'vs 65.9 s step':>15}"
    )
    worst = 0.0
    for shape in a.shapes.split(","):
        groups, size = (int(x) for x in shape.lower().split("x"))
        tr = build_trainer(groups, size, a.micro_batch, a.completion_len, a.hidden, a.layers, **extra)
        out, rewards = synthetic_batch(tr, a.prompt_len, a.completion_len, kept_groups=max(1, groups // 2))
        costs = []
        for _ in range(a.repeats):
            start = time.process_time()  # same clock as update_seconds
            decision = filtered(tr, out, rewards, strategy)
            costs.append(time.process_time() - start)
        filter_s = min(costs)
        kept = decision.metrics["snr/kept_frac"]
        opt = torch.optim.AdamW(tr.model.parameters(), lr=1e-6)
        full = filtered(tr, out, rewards, "off").batch
        update_seconds(tr, full, opt)  # warm-up
        update_s = update_seconds(tr, full, opt)
        frac = filter_s / update_s
        worst = max(worst, frac)
        print(
            f"{shape:>7} {kept:>5.0%} {1000 * filter_s:>10.2f} {update_s:>9.2f} {100 * frac:>13.3f}% "
            f"{100 * filter_s / PAPER_STEP_SECONDS:>14.4f}%"
        )
    print(
        f"worst filter / update: {100 * worst:.3f}% (target < 0.1% of a step) -> {'PASS' if worst < 1e-3 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
