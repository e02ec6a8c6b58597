"""Plot the collapse series a training run wrote (``output_dir/collapse.jsonl``) to one PNG.

    python -m trainer.collapse_report RUN_DIR [--out collapse.png]
    llmgym-collapse-report RUN_DIR

Four panels share the step axis: input dependence of the reasoning (MI-ZScore-EMA), retrieval
accuracy against its chance level, entropies (conditional H(Z|X), marginal H(Z), TRL's token
entropy), and reward variance with the share of groups the SNR filter kept. Template collapse
shows as MI and retrieval falling towards chance while the conditional entropy stays up.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from llm_gym.safe_io import atomic_path

DEFAULT_FILE = "collapse.jsonl"

#: (panel title, y label, [(key, label)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "Input dependence of reasoning (MI z-score, EMA std)",
        "z-score",
        [
            ("mi/trajectory/mi_zscore_ema", "trajectory"),
            ("mi/first_turn/mi_zscore_ema", "first turn"),
        ],
    ),
    (
        "Retrieval of the prompt from its reasoning",
        "accuracy",
        [
            ("mi/trajectory/retrieval_acc", "trajectory"),
            ("mi/trajectory/retrieval_chance", "trajectory chance"),
            ("mi/first_turn/retrieval_acc", "first turn"),
            ("mi/first_turn/retrieval_chance", "first turn chance"),
        ],
    ),
    (
        "Entropy (nats per token)",
        "nats",
        [
            ("mi/trajectory/cond_entropy", "H(Z|X) trajectory"),
            ("mi/trajectory/marginal_entropy", "H(Z) trajectory"),
            ("mi/first_turn/cond_entropy", "H(Z|X) first turn"),
            ("entropy", "policy token entropy (TRL)"),
        ],
    ),
    (
        "Reward variance and SNR filter",
        "value",
        [
            ("snr/group_var_before", "mean group reward variance"),
            ("snr/kept_frac", "kept group fraction"),
            ("frac_reward_zero_std", "zero-std group fraction"),
            ("snr/skipped", "skipped update"),
        ],
    ),
]


#: Bounds on a collapse series (untrusted like any file we read): a row is a few hundred bytes, a run logs one
#: per step, so 1 MiB per line and 64 MiB per file (about 100,000 steps) leave room; only the plotted keys are kept.
MAX_ROW_BYTES = 2**20
MAX_SERIES_BYTES = 64 * 2**20
_KEYS = frozenset({"step", *(key for _, _, keys in PANELS for key, _ in keys)})


def _step(value: object) -> float | None:
    from llm_gym.core.checks import is_number

    if not is_number(value) or not math.isfinite(value):
        return None
    return float(value)


def read_series(path: str | os.PathLike) -> list[dict]:
    """Rows of a collapse JSONL (a run directory or the file itself), sorted by step; each row holds its
    ``step`` and the plotted keys. A bad line (not JSON, nested too deeply, over the bounds above, or without a
    numeric ``step``) is a ``ValueError`` naming the file and line; a torn last line is skipped with a warning."""
    from llm_gym._jsonl import JsonlError, decode_json, iter_lines

    p = Path(path)
    if p.is_dir():
        p = p / DEFAULT_FILE
    if not p.is_file():
        raise FileNotFoundError(
            f"no collapse series at {p} (the trainer writes it when collapse_report is set)"
        )
    rows = []
    with open(p, "rb") as f:
        try:
            for n, raw in iter_lines(
                f, path=str(p), max_line_bytes=MAX_ROW_BYTES, max_total_bytes=MAX_SERIES_BYTES
            ):
                if not raw.strip():
                    continue
                try:
                    row = decode_json(raw)
                except ValueError as e:
                    if not raw.endswith(b"\n"):  # the writer was killed mid-line: skip the torn last line
                        print(f"warning: {p}:{n}: ignoring a torn last line", file=sys.stderr)
                        break
                    raise ValueError(f"{p}:{n}: not JSON: {e}") from None
                if not isinstance(row, dict) or _step(row.get("step")) is None:
                    raise ValueError(f"{p}:{n}: each line must be an object with a numeric 'step'")
                rows.append({k: v for k, v in row.items() if k in _KEYS})
        except JsonlError as e:
            raise ValueError(str(e)) from None
    return sorted(rows, key=lambda r: r["step"])


def series(rows: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(float(r["step"]))
            ys.append(float(v))
    return xs, ys


def summary(rows: Sequence[dict]) -> list[str]:
    """Short text verdicts: trend of MI-ZScore-EMA and retrieval against chance, entropy and kept fraction."""
    lines = []
    for scope in ("trajectory", "first_turn"):
        _, z = series(rows, f"mi/{scope}/mi_zscore_ema")
        _, acc = series(rows, f"mi/{scope}/retrieval_acc")
        _, chance = series(rows, f"mi/{scope}/retrieval_chance")
        _, ent = series(rows, f"mi/{scope}/cond_entropy")
        if len(z) < 1:
            continue
        peak = max(z)
        line = f"{scope}: MI-ZScore-EMA last {z[-1]:.3g} (peak {peak:.3g})"
        if acc and chance:
            line += f", retrieval {acc[-1]:.2f} vs chance {chance[-1]:.2f}"
        if ent:
            line += f", H(Z|X) {ent[-1]:.3g} (first {ent[0]:.3g})"
        lines.append(line)
        if len(z) >= 3 and peak > 0 and z[-1] < 0.5 * peak and ent and ent[-1] >= 0.8 * ent[0]:
            lines.append(
                f"WARNING {scope}: MI fell below half its peak while H(Z|X) held: reasoning is losing its "
                "dependence on the input (template collapse)"
            )
    _, kept = series(rows, "snr/kept_frac")
    _, skipped = series(rows, "snr/skipped")
    if kept:
        lines.append(f"SNR filter: kept fraction last {kept[-1]:.2f}, mean {sum(kept) / len(kept):.2f}")
    if skipped and sum(skipped):
        lines.append(
            f"SNR filter: {int(sum(skipped))} of {len(skipped)} logged steps skipped (no reward variance)"
        )
    return lines


def plot(rows: Sequence[dict], out: str | os.PathLike, title: str = "") -> str:
    """Draw the four panels to ``out`` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(PANELS), 1, figsize=(9, 11), sharex=True)
    for ax, (name, ylabel, keys) in zip(axes, PANELS):
        drawn = 0
        for key, label in keys:
            xs, ys = series(rows, key)
            if not xs:
                continue
            style = "--" if "chance" in key else "-"
            ax.plot(xs, ys, style, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
            drawn += 1
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8, loc="best")
        else:
            ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
    axes[-1].set_xlabel("training step")
    fig.suptitle(title or "llm-gym collapse report", fontsize=12)
    fig.tight_layout()
    out = str(out)
    try:
        with atomic_path(out) as tmp:  # a failed write (full disk) leaves no partial PNG
            fig.savefig(tmp, dpi=110, format=Path(out).suffix[1:] or "png")
    finally:
        plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llmgym-collapse-report",
        description="Plot MI, entropy and reward-variance series of a training run (template-collapse early warning).",
    )
    parser.add_argument("run", help=f"run output_dir (containing {DEFAULT_FILE}) or the JSONL file")
    parser.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/collapse.png)")
    parser.add_argument("--title", default="", help="figure title")
    ns = parser.parse_args(argv)
    try:
        rows = read_series(ns.run)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: {ns.run} holds no logged steps yet", file=sys.stderr)
        return 2
    run_dir = ns.run if os.path.isdir(ns.run) else os.path.dirname(os.path.abspath(ns.run))
    out = ns.out or os.path.join(run_dir, "collapse.png")
    try:
        plot(rows, out, ns.title or f"collapse report: {os.path.basename(os.path.abspath(run_dir))}")
    except OSError as e:  # full disk, an output path under a file: exit 1 (as every llm-gym command)
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    for line in summary(rows):
        print(line)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
