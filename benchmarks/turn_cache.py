"""The KV cache carried across turns vs today's generation (prefix-shared, re-prefilling the history), same run.

For the learning study's 3-turn deterministic 3x3 CoordFrozenLake in ``llmgym-train``'s CPU chat format
(answer-only, one demonstration turn), one ``LLMGymGRPOTrainer`` per model plays rounds of P groups of G through
its own ``rollout_func`` (HF ``generate``), with the turn cache on and off alternately on the same weights and
sampling seed; prefix sharing is on in both (today's default). Per round and path:

* generation seconds (wall, and CPU seconds of this process, which other jobs on the machine do not inflate);
* prefill tokens per episode (padded widths, what the forwards compute) against the episode's *unique* tokens:
  the tokens the model reads but did not sample, with a group's common prompt counted once (its distinct prompt
  once per group, plus every episode's observation and chat-template tokens), the least any exact method prefills;
* peak resident memory above the start of the round (process RSS sampled every 5 ms);
* whether both paths sampled the same tokens.

Medians over ``--repeats`` rounds; the order of the two paths alternates. The last line reads
``turn cache: generation 1.62x faster than today's (smollm2, G=8), prefill 1.03x unique tokens`` (the speed-up in
wall time; the table gives CPU time beside it).

    OMP_NUM_THREADS=1 python benchmarks/turn_cache.py --quick      # tiny random model, seconds
    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/turn_cache.py --models smollm2,organism --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline env vars and repo path, before any torch import)
from prefix_sharing import PeakRSS, make_trainer, seed_rows  # noqa: E402


def model_folder(name: str, setting: Any) -> str:
    from llm_gym.trainer.models import resolve_model
    from llm_gym.trainer.organism import is_organism, materialize

    if is_organism(name):
        return materialize(name, setting.env, setting.env_kwargs)
    return resolve_model(name)


def unique_tokens(out: dict[str, Any], group: int) -> int:
    """Tokens of a round the model reads but did not sample: each group's prompt once, plus every episode's
    environment and template tokens (``env_mask`` 0)."""
    prompts = out["prompt_ids"]
    distinct = sum(len(prompts[g]) for g in range(0, len(prompts), group))
    env = sum(sum(1 for m in mask if m == 0) for mask in out["env_mask"])
    return distinct + env


def one_round(tr: Any, turn_cache: Any, prompts: list[str]) -> dict[str, Any]:
    import torch

    tr.turn_cache = turn_cache
    sharing = tr.prefix_sharing
    before_shared = sharing.generation.processed if sharing is not None else 0
    before_turn = turn_cache.stats.prefill if turn_cache is not None else 0
    torch.manual_seed(1234)
    with PeakRSS() as mem:
        t0, c0 = time.perf_counter(), time.process_time()
        out = tr.rollout_func(prompts, tr)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if turn_cache is not None:
        prefill = turn_cache.stats.prefill - before_turn
    else:
        prefill = sharing.generation.processed - before_shared if sharing is not None else float("nan")
    turns = sum(out["env_turns"])
    return {"wall_s": wall, "cpu_s": cpu, "mib": mem.mib, "prefill": prefill, "out": out, "turns": turns}


def bench(model: str, a: argparse.Namespace) -> dict[str, Any]:
    from learning_study import SETTINGS

    setting = SETTINGS["FrozenLake"]
    folder = a.model_dir if a.model_dir else model_folder(model, setting)
    tr = make_trainer(
        folder, setting, a.group, a.prompts, a.prompts * a.group, quick=True, max_completion_length=a.budget
    )
    cache = tr.turn_cache
    if cache is None:
        raise SystemExit(f"the turn cache is off for {model} (see the log line above)")
    runs: dict[str, list[dict[str, Any]]] = {"turn": [], "today": []}
    same = True
    ratios = []
    for r in range(a.repeats):
        prompts = [row["prompt"] for row in seed_rows(r, a.prompts, a.group)]
        order = ("turn", "today") if r % 2 == 0 else ("today", "turn")
        res = {k: one_round(tr, cache if k == "turn" else None, prompts) for k in order}
        stops = sorted(set(tr.rollout_func.last.stop_reason))
        same &= res["turn"]["out"]["completion_ids"] == res["today"]["out"]["completion_ids"]
        n = len(prompts)
        unique = unique_tokens(res["turn"]["out"], a.group)
        for k in runs:
            runs[k].append(
                {key: v for key, v in res[k].items() if key != "out"} | {"unique": unique, "episodes": n}
            )
        ratios.append(res["turn"]["prefill"] / unique)
        print(
            f"  {model} round {r}: generation {res['turn']['wall_s']:.1f}s ({res['turn']['cpu_s']:.1f} CPU-s) with "
            f"the turn cache, {res['today']['wall_s']:.1f}s ({res['today']['cpu_s']:.1f} CPU-s) today; prefill "
            f"{res['turn']['prefill']} vs {res['today']['prefill']} "
            f"tokens, unique {unique}; turns {res['turn']['turns']} (episodes ended: {', '.join(stops)})",
            file=sys.stderr,
            flush=True,
        )

    def med(kind: str, key: str) -> float:
        return statistics.median(float(x[key]) for x in runs[kind])

    out: dict[str, Any] = {
        "model": model,
        "G": a.group,
        "P": a.prompts,
        "repeats": a.repeats,
        "same_tokens": same,
    }
    for kind in runs:
        for key in ("wall_s", "cpu_s", "mib"):
            out[f"{key}_{kind}"] = med(kind, key)
        out[f"prefill_per_episode_{kind}"] = med(kind, "prefill") / (a.prompts * a.group)
    out["unique_per_episode"] = med("turn", "unique") / (a.prompts * a.group)
    out["prefill_over_unique"] = statistics.median(ratios)
    out["speedup_wall"] = out["wall_s_today"] / out["wall_s_turn"]
    out["speedup_cpu"] = out["cpu_s_today"] / out["cpu_s_turn"]
    out["turns_per_episode"] = med("turn", "turns") / (a.prompts * a.group)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2,organism", help="comma-separated model aliases or folders")
    p.add_argument("--group", type=int, default=8, help="G, rollouts per group (default 8)")
    p.add_argument("--prompts", type=int, default=2, help="groups per round (llmgym-train's CPU default: 2)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--budget",
        type=int,
        default=600,
        help="max_completion_length: room for all three turns (the organism's tokenizer spends more tokens per turn)",
    )
    p.add_argument("--quick", action="store_true", help="tiny random model, G=4, one round: seconds")
    p.add_argument("--json", default=None, help="write the results (JSON) to this file")
    a = p.parse_args(argv)
    a.model_dir = None
    models = a.models.split(",")
    if a.quick:
        from tests._tiny import build_tiny_model

        a.model_dir = build_tiny_model(tempfile.mkdtemp(prefix="bench_turn_tiny_"))
        models, a.group, a.repeats = ["tiny"], 4, 2
    print(
        f"{'model':<10}{'G':>3}  {'gen s turn/today':>18} {'x':>6}  {'CPU s turn/today':>18} {'x':>6}  "
        f"{'prefill/episode turn/today':>27}  {'unique':>7} {'ratio':>6}  {'MiB turn/today':>15}  same"
    )
    results = []
    for model in models:
        r = bench(model, a)
        results.append(r)
        print(
            f"{model:<10}{a.group:>3}  {r['wall_s_turn']:>8.2f}/{r['wall_s_today']:<9.2f} {r['speedup_wall']:>5.2f}x  "
            f"{r['cpu_s_turn']:>8.2f}/{r['cpu_s_today']:<9.2f} {r['speedup_cpu']:>5.2f}x  "
            f"{r['prefill_per_episode_turn']:>13.1f}/{r['prefill_per_episode_today']:<13.1f}  "
            f"{r['unique_per_episode']:>7.1f} {r['prefill_over_unique']:>5.2f}x  "
            f"{r['mib_turn']:>7.0f}/{r['mib_today']:<7.0f}  {r['same_tokens']}",
            flush=True,
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results}, indent=1))
    pick = results[0]
    print(
        f"turn cache: generation {pick['speedup_wall']:.2f}x faster than today's ({pick['model']}, G={a.group}), "
        f"prefill {pick['prefill_over_unique']:.2f}x unique tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
