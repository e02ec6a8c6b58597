"""Load test of ``llmgym serve``: many concurrent sessions against one server, compared with in-process ``step()``
in the same run, then the server's memory across thousands of sessions opened and closed.

    OMP_NUM_THREADS=1 python benchmarks/env_server.py [--sessions 64] [--steps 100] [--churn 10000]
    python benchmarks/env_server.py --quick          # 8 sessions x 20 steps, 300 sessions churned (the test)

Phases (all on 127.0.0.1; the server is a subprocess, the clients one asyncio process, so both share the
machine's cores):

1. reference: the same env, seeds and action texts stepped in-process with ``env.step`` (p50/p99 latency, steps/s);
2. load: ``--sessions`` WebSocket sessions at once, each resetting with its own seed and sending ``--steps``
   steps (resetting whenever an episode ends), every reply checked; latency is per step as a client sees it
   (send to reply); errors are counted, never retried;
3. churn: ``--churn`` sessions opened, reset, stepped once and closed, ``--churn_concurrency`` at a time; the
   server's RSS (``/proc/PID/status``) before and after, and its open-env count after (must be 0).

Prints a table and the ratios; ``--json PATH`` writes the numbers (never into docs/ unless asked).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnasium as gym  # noqa: E402

import llm_gym  # noqa: E402,F401
from tests._serve import start_server  # noqa: E402

ENV_ID = "llmgym/FrozenLake-v0"
ENV_KWARGS = {"max_turns": 20, "max_actions": 40}
MOVES = ("Up", "Down", "Left", "Right")


def action_texts(n: int) -> list[str]:
    out = []
    for i in range(n):
        a, b = MOVES[i % 4], MOVES[(i * 7 + 1) % 4]
        out.append(f"<think>I will go {a.lower()} then {b.lower()}.</think><answer>{a} || {b}</answer>")
    out[5::11] = ["not an answer"] * len(out[5::11])  # some invalid turns, as a model makes
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def in_process(sessions: int, steps: int, texts: list[str]) -> dict:
    env = gym.make(ENV_ID, **ENV_KWARGS)
    lat = []
    t_all = time.perf_counter()
    for s in range(sessions):
        env.reset(seed=s)
        for i in range(steps):
            t0 = time.perf_counter()
            _, _, term, trunc, _ = env.step(texts[(s + i) % len(texts)])
            lat.append(time.perf_counter() - t0)
            if term or trunc:
                env.reset(seed=s + 100_000 + i)
    wall = time.perf_counter() - t_all
    return {
        "steps": len(lat),
        "p50_us": pct(lat, 0.5) * 1e6,
        "p99_us": pct(lat, 0.99) * 1e6,
        "steps_per_s": len(lat) / sum(lat),
        "wall_s": wall,
    }


async def _session(url: str, seed: int, steps: int, texts: list[str], lat: list, errors: list) -> None:
    from websockets.asyncio.client import connect

    try:
        async with connect(url, proxy=None, open_timeout=60, max_size=1 << 22) as ws:

            async def call(msg: dict) -> dict:
                await ws.send(json.dumps(msg))
                reply = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if reply.get("type") != "observation":
                    raise RuntimeError(str(reply)[:200])
                return reply["data"]

            reset = {"type": "reset", "data": {"seed": seed, "env_id": ENV_ID, "env_kwargs": ENV_KWARGS}}
            await call(reset)
            for i in range(steps):
                t0 = time.perf_counter()
                data = await call({"type": "step", "data": {"text": texts[(seed + i) % len(texts)]}})
                lat.append(time.perf_counter() - t0)
                if data["done"]:
                    reset["data"]["seed"] = seed + 100_000 + i
                    await call(reset)
            await ws.send(json.dumps({"type": "close"}))
    except Exception as e:  # noqa: BLE001 (counted, reported)
        errors.append(f"session {seed}: {type(e).__name__}: {e}")


async def load(ws_url: str, sessions: int, steps: int, texts: list[str]) -> dict:
    lat: list[float] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(_session(ws_url, s, steps, texts, lat, errors) for s in range(sessions)))
    wall = time.perf_counter() - t0
    return {
        "steps": len(lat),
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_us": pct(lat, 0.5) * 1e6 if lat else float("nan"),
        "p99_us": pct(lat, 0.99) * 1e6 if lat else float("nan"),
        "steps_per_s": len(lat) / wall,
        "wall_s": wall,
    }


async def churn(ws_url: str, n: int, concurrency: int, texts: list[str]) -> int:
    errors = 0
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        nonlocal errors
        async with sem:
            lat: list = []
            errs: list = []
            await _session(ws_url, i, 1, texts, lat, errs)
            errors += len(errs)

    await asyncio.gather(*(one(i) for i in range(n)))
    return errors


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--churn", type=int, default=10_000)
    ap.add_argument("--churn_concurrency", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="8 sessions x 20 steps, 300 sessions churned")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.steps, args.churn, args.churn_concurrency = 8, 20, 300, 8
    texts = action_texts(64)

    ref = in_process(args.sessions, args.steps, texts)
    server = start_server(
        "--env", ENV_ID, "--max_sessions", str(max(args.sessions, args.churn_concurrency) + 8)
    )
    try:
        ws_url = "ws" + server.url[4:] + "/ws"
        remote = asyncio.run(load(ws_url, args.sessions, args.steps, texts))
        # warm-up: the first few thousand sessions grow the allocator's pools and caches (measured: flat after)
        asyncio.run(churn(ws_url, min(2000, args.churn // 5), args.churn_concurrency, texts))
        rss_before = rss_kib(server.proc.pid)
        t0 = time.perf_counter()
        churn_errors, rss_steps = 0, []
        for _ in range(4):  # RSS after each quarter: a leak grows with every quarter, warm-up growth does not
            churn_errors += asyncio.run(churn(ws_url, args.churn // 4, args.churn_concurrency, texts))
            rss_steps.append(rss_kib(server.proc.pid))
        churn_s = time.perf_counter() - t0
        open_after = server.wait_open_envs(0, timeout=30)
        rss_after = rss_kib(server.proc.pid)
    finally:
        server.stop()

    print(f"env {ENV_ID} {ENV_KWARGS}; {os.cpu_count()} CPUs; server and clients on this machine")
    print(f"{'':38} {'steps':>7} {'p50 us':>9} {'p99 us':>9} {'steps/s':>9}")
    print(
        f"{'in-process env.step()':38} {ref['steps']:>7} {ref['p50_us']:>9.0f} {ref['p99_us']:>9.0f} {ref['steps_per_s']:>9.0f}"
    )
    label = f"server, {args.sessions} sessions x {args.steps} steps"
    print(
        f"{label:38} {remote['steps']:>7} {remote['p50_us']:>9.0f} {remote['p99_us']:>9.0f} {remote['steps_per_s']:>9.0f}"
    )
    print(
        f"ratios (server / in-process): p50 latency {remote['p50_us'] / ref['p50_us']:.0f}x, "
        f"throughput {remote['steps_per_s'] / ref['steps_per_s']:.3f}x"
    )
    print(f"errors under load: {remote['errors']} {remote['first_errors'] if remote['errors'] else ''}")
    print(
        f"churn: {args.churn} sessions opened and closed in {churn_s:.1f} s ({args.churn / churn_s:.0f}/s), "
        f"{churn_errors} errors; server RSS {rss_before / 1024:.1f} MiB before, {rss_after / 1024:.1f} MiB after "
        f"({(rss_after - rss_before) / 1024:+.1f} MiB); open envs after: {open_after}"
    )
    print(
        "server RSS after each quarter of the churn (MiB): " + ", ".join(f"{r / 1024:.1f}" for r in rss_steps)
    )
    result = {
        "env_id": ENV_ID,
        "env_kwargs": ENV_KWARGS,
        "sessions": args.sessions,
        "steps_per_session": args.steps,
        "in_process": ref,
        "server": remote,
        "churn": {
            "sessions": args.churn,
            "seconds": churn_s,
            "errors": churn_errors,
            "rss_kib_before": rss_before,
            "rss_kib_after": rss_after,
            "rss_kib_quarters": rss_steps,
            "open_envs_after": open_after,
        },
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    ok = (
        remote["errors"] == 0
        and churn_errors == 0
        and open_after == 0
        and remote["steps"] == args.sessions * args.steps
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
