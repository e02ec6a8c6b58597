"""The opt-in math-verify checker: differential accuracy against ours on labelled pairs, and a hostile answer
cannot hang the env (time-limited worker process)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401
from llm_gym.envs.metamathqa.math_check import is_equivalent, radical
from llm_gym.envs.metamathqa.math_verify_checker import MAX_CHARS, MathVerifyWorker, shared_worker

PAIRS = [json.loads(line) for line in (Path(__file__).parent / "data" / "math_answer_pairs.jsonl").open()]
#: Measured on this file (see docs/integrations.md); a regression in our checker drops below it.
OURS_FLOOR = 0.95
#: Cases the issue names; our verdict on each must match its label.
KNOWN = {"2+3", "2/\\sqrt{2}", "(1, 2)", "\u22123", "not 12"}


def test_pairs_file_is_large_and_balanced():
    assert len(PAIRS) >= 50
    labels = [p["label"] for p in PAIRS]
    assert 0.3 < sum(labels) / len(labels) < 0.7
    assert KNOWN <= {p["pred"] for p in PAIRS}


def test_our_checker_on_known_cases_and_radicals():
    for p in PAIRS:
        if p["pred"] in KNOWN:
            assert is_equivalent(p["pred"], p["gold"]) == p["label"], p
    assert radical("2\\sqrt{3}") == radical("\\sqrt{12}") != radical("2\\sqrt{2}")
    assert radical("3\\sqrt{2}/0") is None and radical("x\\sqrt{2}") is None


def test_differential_accuracy_table(capsys):
    pytest.importorskip("math_verify")
    worker = shared_worker()
    rows = []
    for p in PAIRS:
        ours = is_equivalent(p["pred"], p["gold"])
        theirs = worker.check(p["pred"], p["gold"])
        rows.append((p, ours, theirs))
    acc_ours = sum(o == p["label"] for p, o, _ in rows) / len(rows)
    acc_mv = sum(t == p["label"] for p, _, t in rows) / len(rows)
    with capsys.disabled():
        print(f"\n{'pred':<26} {'gold':<22} label  ours   math-verify")
        for p, o, t in rows:
            if o != p["label"] or t != p["label"]:
                print(f"{p['pred']!r:<26} {p['gold']!r:<22} {p['label']!s:<6} {o!s:<6} {t!s:<6}  {p['note']}")
        print(f"accuracy on {len(rows)} pairs: ours {acc_ours:.3f}, math-verify {acc_mv:.3f}")
    assert acc_ours >= OURS_FLOOR
    # Both must agree on the plainest cases, or the harness (not the checkers) is broken.
    assert worker.check("12", "12") and not worker.check("13", "12")


def test_hostile_answer_times_out_and_the_worker_recovers():
    pytest.importorskip("math_verify")
    worker = MathVerifyWorker(timeout=1.0)
    try:
        assert worker.check("\\frac{1}{2}", "0.5")  # starts the worker (not timed)
        # A power tower sympy tries to evaluate: far beyond the deadline without the worker's kill.
        hostile = "9^{9^{9^{9^{9}}}}"
        start = time.monotonic()
        assert worker.check(hostile, "10") is False
        assert time.monotonic() - start < 1.0 + 2.0
        assert worker.timeouts == 1  # it was the deadline that stopped it, not a quick parse failure
        assert worker.check("12", "12")  # a fresh worker answers again
        # Overlong input is refused before it reaches the worker.
        assert worker.check("1" * (MAX_CHARS + 1), "1") is False
        assert worker.check(None, "1") is False  # type: ignore[arg-type]
    finally:
        worker.close()


def test_env_checker_option():
    pytest.importorskip("math_verify")
    env = gym.make("llmgym/MetaMathQASample-v0", checker="math-verify")
    _, info = env.reset(seed=0)
    gold = info["gold_answer"]
    _, reward, terminated, _, info = env.step(f"<think>.</think><answer>\\boxed{{{gold}}}</answer>")
    assert terminated and info["success"] and reward == 1.0
    env.close()
    with pytest.raises(ValueError, match="checker"):
        gym.make("llmgym/MetaMathQASample-v0", checker="sympy")
    with pytest.raises(ValueError, match="strict"):
        gym.make("llmgym/MetaMathQASample-v0", checker="math-verify", strict=True)


# The worker is a plain subprocess (not multiprocessing): it must work inside Gymnasium's daemonic
# AsyncVectorEnv workers, in a forked child and in a script without a __main__ guard, and never raise.
_RIGHT = "<think>.</think><answer>\\boxed{{{}}}</answer>"


def _mv_env():
    return gym.make("llmgym/MetaMathQASample-v0", checker="math-verify")


@pytest.mark.parametrize("context", [None, "spawn"])
def test_math_verify_inside_async_vector_env(context):
    pytest.importorskip("math_verify")
    vec = gym.vector.AsyncVectorEnv([_mv_env], context=context)
    try:
        _, info = vec.reset(seed=0)
        _, reward, _, _, _ = vec.step([_RIGHT.format(info["gold_answer"][0])])
        assert reward.tolist() == [1.0]
    finally:
        vec.close()


def test_math_verify_in_forked_child_uses_its_own_worker():
    import os

    pytest.importorskip("math_verify")
    env = _mv_env()
    _, info = env.reset(seed=0)
    assert env.step(_RIGHT.format(info["gold_answer"]))[1] == 1.0  # the parent's worker is running now
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (child)
        code = 1
        try:
            os.close(read_fd)
            _, child_info = env.reset(seed=1)
            reward = env.step(_RIGHT.format(child_info["gold_answer"]))[1]
            os.write(write_fd, repr(reward).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        child_reward = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and child_reward == "1.0"
    # The child neither killed nor used the parent's worker.
    _, info = env.reset(seed=2)
    assert env.step(_RIGHT.format(info["gold_answer"]))[1] == 1.0
    env.close()


def test_math_verify_in_script_without_main_guard(tmp_path):
    import subprocess
    import sys

    pytest.importorskip("math_verify")
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import gymnasium as gym, llm_gym\n"
        "print('top-level', flush=True)\n"
        "env = gym.make('llmgym/MetaMathQASample-v0', checker='math-verify')\n"
        "_, info = env.reset(seed=0)\n"
        f"print('reward', env.step({_RIGHT!r}.format(info['gold_answer']))[1])\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # Spawn-based workers re-ran the script's top level (twice 'top-level') and then failed with EOFError.
    assert out.stdout.split("\n").count("top-level") == 1 and "reward 1.0" in out.stdout


def test_math_verify_worker_failures_count_as_wrong(monkeypatch):
    import os
    import signal

    from llm_gym.envs.metamathqa import math_verify_checker as mvc

    pytest.importorskip("math_verify")
    worker = MathVerifyWorker(timeout=2.0)
    try:
        monkeypatch.setattr(mvc, "WORKER_MODULE", "llm_gym.no_such_module")
        assert worker.check("1", "1") is False and worker.failures == 1  # failed start-up: wrong, no raise
        monkeypatch.undo()
        assert worker.check("1", "1") is True
        os.kill(worker._proc.pid, signal.SIGKILL)  # dies between checks: restarted
        assert worker.check("2", "2") is True
    finally:
        worker.close()
