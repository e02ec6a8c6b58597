"""Load test of ``llmgym serve``: many concurrent sessions against one server, compared with in-process ``step()``
in the same run, then the server's memory across thousands of sessions opened and closed.

    OMP_NUM_THREADS=1 python benchmarks/env_server.py [--sessions 64] [--steps 100] [--churn 10000]
    python benchmarks/env_server.py --quick          # 8 sessions x 20 steps, 300 churned, 40 slowloris (the test)

Phases (all on 127.0.0.1; the server is a subprocess, the clients one asyncio process, so both share the
machine's cores):

1. reference: the same env, seeds and action texts stepped in-process with ``env.step`` (p50/p99 latency, steps/s);
2. load: ``--sessions`` WebSocket sessions at once, each resetting with its own seed and sending ``--steps``
   steps (resetting whenever an episode ends), every reply checked; latency is per step as a client sees it
   (send to reply); errors are counted, never retried;
3. churn: ``--churn`` sessions opened, reset, stepped once and closed, ``--churn_concurrency`` at a time; the
   server's RSS (``/proc/PID/status``) before and after, and its open-env count after (must be 0);
4. slowloris: phase 2 again, now beside ``--slowloris`` connections that each hold half an HTTP request and send a
   byte a second (reopened when the server closes them), for at least ``--slowloris_s``; in both runs (phase 2 is
   the reference) a prober GETs ``/health`` every 0.1 s on a new connection, and its latency while the sessions
   run is printed. The server must answer every probe and every step (0 errors), and close the half-sent requests
   (past the read deadline, or the oldest when the connections waiting for a request reach their bound).

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


async def _health(
    port: int, stop: asyncio.Event, lat: list[float], bad: list[str], busy: asyncio.Event
) -> None:
    """GET /health every 0.1 s on a new connection until ``stop``; the latency of each answer while ``busy`` (the
    sessions run), every non-200 kept."""
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
            writer.write(b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.read(64), 10)
            writer.close()
            status = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else head
            if status != b"200":
                bad.append(status.decode("latin-1"))
            elif busy.is_set():
                lat.append(time.perf_counter() - t0)
        except (OSError, asyncio.TimeoutError) as e:
            bad.append(type(e).__name__)
        await asyncio.sleep(0.1)


async def _slow_client(port: int, stop: asyncio.Event, stats: dict) -> None:
    """Holds half an HTTP request, a byte a second, and opens another when the server closes it."""
    while not stop.is_set():
        writer = None
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            stats["opened"] += 1
            writer.write(b"POST /llmgym/describe HTTP/1.1\r\nHost: bench\r\nX-Slow: ")
            await writer.drain()
            while not stop.is_set():
                try:
                    if await asyncio.wait_for(reader.read(1024), 1.0) == b"":
                        break
                except asyncio.TimeoutError:  # still open: one more byte
                    writer.write(b"a")
                    await writer.drain()
            else:
                return
            stats["closed_by_server"] += 1
        except OSError:
            stats["closed_by_server"] += 1
            await asyncio.sleep(0.1)
        finally:
            if writer is not None:
                writer.close()


async def load(
    ws_url: str,
    sessions: int,
    steps: int,
    texts: list[str],
    *,
    port: int,
    slowloris: int = 0,
    min_s: float = 0,
) -> dict:
    """Phase 2 (``slowloris`` 0) or 4: the sessions, the /health prober and the slow clients at once."""
    lat: list[float] = []
    errors: list[str] = []
    health: list[float] = []
    bad_health: list[str] = []
    slow = {"opened": 0, "closed_by_server": 0}
    stop, busy = asyncio.Event(), asyncio.Event()
    background = [asyncio.ensure_future(_health(port, stop, health, bad_health, busy))]
    background += [asyncio.ensure_future(_slow_client(port, stop, slow)) for _ in range(slowloris)]
    t0 = time.perf_counter()
    if slowloris:
        await asyncio.sleep(1.0)  # the slow clients are in place before the sessions start
    busy.set()
    t1 = time.perf_counter()
    await asyncio.gather(*(_session(ws_url, s, steps, texts, lat, errors) for s in range(sessions)))
    wall = time.perf_counter() - t1
    busy.clear()
    while time.perf_counter() - t0 < min_s:
        await asyncio.sleep(0.2)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*background), 30)
    return {
        "slowloris": slowloris,
        "health_probes": len(health),
        "health_errors": len(bad_health),
        "first_health_errors": bad_health[:3],
        "health_p50_ms": pct(health, 0.5) * 1e3 if health else float("nan"),
        "health_p99_ms": pct(health, 0.99) * 1e3 if health else float("nan"),
        "health_max_ms": max(health) * 1e3 if health else float("nan"),
        "slow_opened": slow["opened"],
        "slow_closed_by_server": slow["closed_by_server"],
        "phase_s": time.perf_counter() - t0,
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
    ap.add_argument(
        "--slowloris",
        type=int,
        default=None,
        help="half-sent HTTP requests held beside the sessions (default 256: more than uvicorn's old limit of "
        "max_sessions + 64 connections, fewer than the server's --max_waiting_connections; 0: skip)",
    )
    ap.add_argument("--slowloris_s", type=float, default=15.0, help="least seconds the slow clients are held")
    ap.add_argument("--read_timeout", type=float, default=10.0, help="the server's --read_timeout")
    ap.add_argument(
        "--quick", action="store_true", help="8 sessions x 20 steps, 300 churned, 40 slowloris for 3 s"
    )
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.steps, args.churn, args.churn_concurrency = 8, 20, 300, 8
        args.slowloris, args.slowloris_s, args.read_timeout = 40, 3.0, 2.0
    texts = action_texts(64)
    max_sessions = max(args.sessions, args.churn_concurrency) + 8
    if args.slowloris is None:
        args.slowloris = 256

    ref = in_process(args.sessions, args.steps, texts)
    server = start_server(
        "--env", ENV_ID, "--max_sessions", str(max_sessions), "--read_timeout", str(args.read_timeout)
    )
    try:
        ws_url = "ws" + server.url[4:] + "/ws"
        remote = asyncio.run(load(ws_url, args.sessions, args.steps, texts, port=server.port))
        attacked = None
        if args.slowloris:
            attacked = asyncio.run(
                load(
                    ws_url,
                    args.sessions,
                    args.steps,
                    texts,
                    port=server.port,
                    slowloris=args.slowloris,
                    min_s=args.slowloris_s,
                )
            )
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
    runs = [("load (reference)", remote)] + (
        [(f"load + {args.slowloris} slowloris", attacked)] if attacked else []
    )
    print(
        f"{'':28} {'steps':>6} {'errors':>6} {'steps/s':>8} {'/health':>7} {'failed':>6} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'max ms':>7}"
    )
    for name, r in runs:
        print(
            f"{name:28} {r['steps']:>6} {r['errors']:>6} {r['steps_per_s']:>8.0f} {r['health_probes']:>7} "
            f"{r['health_errors']:>6} {r['health_p50_ms']:>7.1f} {r['health_p99_ms']:>7.1f} {r['health_max_ms']:>7.1f}"
        )
    if attacked:
        print(
            f"slowloris: {attacked['slow_opened']} half-sent requests opened over {attacked['phase_s']:.1f} s, "
            f"{attacked['slow_closed_by_server']} closed by the server (read deadline {args.read_timeout:g} s); ratios (slowloris / reference): throughput "
            f"{attacked['steps_per_s'] / remote['steps_per_s']:.2f}x, /health p99 "
            f"{attacked['health_p99_ms'] / remote['health_p99_ms']:.2f}x"
        )
        if attacked["errors"]:
            print(f"errors beside the slowloris: {attacked['first_errors']}")
        if attacked["health_errors"]:
            print(f"/health failures beside the slowloris: {attacked['first_health_errors']}")
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
        "slowloris": attacked,
        "read_timeout_s": args.read_timeout,
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
        and remote["health_errors"] == 0
        and (
            attacked is None
            or attacked["errors"] == 0
            and attacked["health_errors"] == 0
            and attacked["steps"] == args.sessions * args.steps
            and attacked["slow_closed_by_server"] > 0
        )
        and churn_errors == 0
        and open_after == 0
        and remote["steps"] == args.sessions * args.steps
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
