"""Which format demonstration lets a model answer validly without handing it a policy? A probe on pilot seeds.

For each demonstration kind (``ChatFormat(one_shot=True, demonstration=...)``: ``action``, the env's fixed example
answer; ``solver``, the solver's move for the example's own state; ``several``, three examples with different
solver moves; ``placeholder``, an answer that is no legal action) and without any demonstration (``none``), it
plays the model on **pilot seeds** (never the study's held-out seeds) of the learning study's environment settings
and reports, with Wilson 95% intervals: success, the share of fully valid episodes, and the action distribution of
the valid moves (a model copying a constant demonstration shows one action taking nearly all). The random
valid-action policy and the best constant answer on the same seeds are printed beside them.

    OMP_NUM_THREADS=1 python benchmarks/demonstration_probe.py --quick            # tiny random model, seconds
    OMP_NUM_THREADS=1 python benchmarks/demonstration_probe.py --envs FrozenLake Bandit --num-seeds 64 \\
        --out /tmp/demo_probe.json                                              # the untrained SmolLM2
    # after a warm start: the warm-started model without any demonstration
    python benchmarks/demonstration_probe.py --model OUT/final --demonstrations none --out /tmp/ws_probe.json

Nothing is written into ``docs/`` (``--out`` names the results file; default: print only).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline, single-threaded; before torch)
from learning_study import HELD_OUT_SEED, SETTINGS  # noqa: E402

from llm_gym.agent.baselines import (  # noqa: E402
    NoBaseline,
    baseline_success,
    constant_action_success,
    format_rate,
)

KINDS = ("none", "action", "solver", "several", "placeholder")
#: First pilot seed (the learning study's pilots; far below the held-out seeds).
PILOT_SEED = 5000


def chat_for(kind: str, include_instructions: bool = True) -> Any:
    from llm_gym.agent.chat import ChatFormat

    if kind == "none":
        return ChatFormat(include_instructions=include_instructions)
    return ChatFormat(one_shot=True, demonstration=kind, include_instructions=include_instructions)


def probe(
    model: str,
    env_name: str,
    seeds: Sequence[int],
    kinds: Sequence[str],
    *,
    dtype: str,
    include_instructions: bool,
) -> dict[str, Any]:
    from llm_gym.trainer.warm_start import evaluate_model

    s = SETTINGS[env_name]
    kwargs = s.env_kwargs_with_limits()
    base = baseline_success(s.env, seeds, kwargs)
    try:
        const = constant_action_success(s.env, seeds, kwargs)
    except NoBaseline:
        const = None
    out: dict[str, Any] = {"baseline": base, "constant_actions": const, "kinds": {}}
    for kind in kinds:
        t0 = time.perf_counter()
        ev = evaluate_model(
            model,
            s.env,
            seeds,
            env_kwargs=kwargs,
            chat=chat_for(kind, include_instructions),
            temperature=0.5,
            max_new_tokens=s.max_new_tokens,
            dtype=dtype,
        )
        moves = sum(ev["actions"].values())
        top = max(ev["actions"].items(), key=lambda kv: kv[1]) if moves else None
        ev["top_action_share"] = [top[0], top[1] / moves] if top else None
        ev["wall_seconds"] = round(time.perf_counter() - t0, 1)
        out["kinds"][kind] = ev
        print(f"[demonstration_probe] {env_name} {kind}: {line(ev)} ({ev['wall_seconds']:.0f}s)", flush=True)
    return out


def line(ev: dict[str, Any]) -> str:
    top = ev.get("top_action_share")
    share = f"; top action {top[0]} {top[1]:.0%} of {sum(ev['actions'].values())} valid moves" if top else ""
    return f"success {format_rate(ev['success'], 2)}, valid {format_rate(ev['valid'], 2)}{share}"


def markdown(results: dict[str, Any]) -> str:
    rows = ["| environment | demonstration | success | valid episodes | valid moves | top action share |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for env_name, env in results["envs"].items():
        for kind, ev in env["kinds"].items():
            top = ev.get("top_action_share")
            rows.append(
                f"| {env_name} | {kind} | {format_rate(ev['success'], 2)} | {format_rate(ev['valid'], 2)} | "
                f"{sum(ev['actions'].values())} | {f'{top[0]} {top[1]:.0%}' if top else '-'} |"
            )
        b, c = env["baseline"], env["constant_actions"]
        ref = f"random valid {format_rate(b['random'], 2)}" if b.get("random") else "no random baseline"
        if c:
            action, rate = max(c.items(), key=lambda kv: kv[1]["rate"])
            ref += f", best constant (always {action}) {format_rate(rate, 2)}"
        rows.append(f"| {env_name} | *reference* | {ref} | | | |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny random model, 2 seeds (seconds)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--envs", nargs="+", default=["FrozenLake", "Bandit"], choices=list(SETTINGS))
    p.add_argument("--demonstrations", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--seed", type=int, default=PILOT_SEED, help="first pilot seed")
    p.add_argument("--num-seeds", type=int, default=64)
    p.add_argument("--no-instructions", action="store_true", help="compact prompt: no env instructions")
    p.add_argument(
        "--dtype", default="bfloat16", help="evaluation dtype (bfloat16: 2x faster on AVX512-BF16)"
    )
    p.add_argument("--out", default=None, help="results JSON (default: print only)")
    a = p.parse_args(argv)
    if a.seed + a.num_seeds > HELD_OUT_SEED:
        raise SystemExit(f"pilot seeds must stay below the held-out seeds ({HELD_OUT_SEED}..)")
    tmp = tempfile.TemporaryDirectory(prefix="demo_probe_")
    model = a.model
    if a.quick:
        from tests._tiny import build_tiny_model

        model, a.num_seeds, a.dtype = build_tiny_model(Path(tmp.name) / "tiny"), 2, "float32"
    seeds = list(range(a.seed, a.seed + a.num_seeds))
    results: dict[str, Any] = {
        "command": "python benchmarks/demonstration_probe.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": "tiny random (quick)" if a.quick else a.model,
        "seeds": [seeds[0], seeds[-1]],
        "include_instructions": not a.no_instructions,
        "envs": {},
    }
    for env_name in a.envs:
        results["envs"][env_name] = probe(
            model,
            env_name,
            seeds,
            a.demonstrations,
            dtype=a.dtype,
            include_instructions=not a.no_instructions,
        )
    print(markdown(results))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    tmp.cleanup()
    return results


if __name__ == "__main__":
    main()
