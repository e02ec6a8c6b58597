"""A resumed run continues like an uninterrupted one, and checkpoints are complete before anything is rotated.

Covers: the signal state (MI cadence, EMAs, pair and copy generators, early-stop state, the records cadence)
saved in every checkpoint and restored on ``--resume``; the completion marker written after every process's
files and before ``save_total_limit`` deletes older checkpoints; the per-rank files a marker implies; and rank 0
alone choosing the checkpoint of a multi-process ``--resume``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

import llm_gym.trainer.cli as train_cli  # noqa: E402
import llm_gym.trainer.grpo as grpo  # noqa: E402
import llm_gym.trainer.output as output  # noqa: E402
from llm_gym.trainer.output import (  # noqa: E402
    MARKER,
    SIGNAL_STATE_FILE,
    checkpoint_problem,
    publish_resume_choice,
    read_resume_choice,
    write_checkpoint_marker,
)

from tests._tiny import tiny_train_argv  # noqa: E402


def _args(tiny_dir, out: Path, *extra: str) -> list[str]:
    return [
        *tiny_train_argv(tiny_dir, out, num_eval_seeds=0),
        # MI every 3 rounds with EMAs; records every 3 rounds: both restart at 0 if the state is lost
        "--mi_every",
        "3",
        "--records_every",
        "3",
        "--early_stop_reward_std_ratio",
        "0.01",
        "--early_stop_window",
        "1",
        *extra,
    ]


def _state(ckpt: Path) -> dict:
    return json.loads((ckpt / SIGNAL_STATE_FILE.format(rank=0)).read_text())


def test_a_resumed_run_has_the_signal_state_of_an_uninterrupted_one(tiny_dir, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train_cli.main(_args(tiny_dir, straight, "--max_steps", "4")) == 0
    assert train_cli.main(_args(tiny_dir, resumed, "--max_steps", "2")) == 0
    assert train_cli.main(_args(tiny_dir, resumed, "--max_steps", "4", "--resume")) == 0
    a, b = _state(straight / "checkpoint-4"), _state(resumed / "checkpoint-4")
    assert a["signal_state"]["rounds"] == 4 and a["generation_rounds"] == 4
    # the tiny model's rounds keep no group: the empty streak spans the resume (a fresh state would say 2)
    assert a["signal_state"]["consecutive_empty"] == 4
    assert a["signal_state"]["ema"], "MI ran, so its EMAs are part of the state"
    assert "RewardStdCollapseCallback" in a["callbacks"] and "EmptyStopCallback" in a["callbacks"]
    assert a["skipped_steps"] == 4  # every round kept nothing: every optimizer step was a no-op
    assert b == a  # counters, EMAs, generator states, skipped steps, early-stop state
    # the records cadence continued: training rounds at steps 0 and 3 only, in both runs
    from llm_gym.agent.records import read_records

    def rounds(run: Path) -> list[int]:
        return sorted(
            r.meta["step"] for r in read_records(run / "episodes.jsonl") if r.meta["mode"] == "train"
        )

    assert rounds(resumed) == rounds(straight) and set(rounds(straight)) == {0, 3}


def test_rotation_waits_for_the_marker(tiny_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    calls = []
    real = grpo.write_checkpoint_marker

    def killed_at_the_second_marker(folder, step, world_size=1):
        calls.append(step)
        if step == 2:
            raise KeyboardInterrupt  # the run dies between checkpoint-2's files and its marker
        return real(folder, step, world_size)

    monkeypatch.setattr(grpo, "write_checkpoint_marker", killed_at_the_second_marker)
    with pytest.raises(KeyboardInterrupt):
        train_cli.main(_args(tiny_dir, run, "--max_steps", "3", "--save_total_limit", "1"))
    # save_total_limit=1 did not delete checkpoint-1 before checkpoint-2 was complete
    assert calls == [1, 2] and checkpoint_problem(run / "checkpoint-1") is None
    assert not (run / "checkpoint-2" / MARKER).exists()
    assert "no llmgym_checkpoint.json" in checkpoint_problem(run / "checkpoint-2")
    folder, skipped = output.find_resume_checkpoint(run)
    assert folder == run / "checkpoint-1" and skipped[0][0] == "checkpoint-2"


def _checkpoint(folder: Path, files: list[str]) -> Path:
    folder.mkdir(parents=True)
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")
    return folder


def test_the_marker_implies_each_ranks_files(tmp_path):
    base = ["trainer_state.json", "model.safetensors"]
    two = [
        *base,
        "rng_state_0.pth",
        "rng_state_1.pth",
        "llmgym_signal_state_0.json",
        "llmgym_signal_state_1.json",
    ]
    ok = _checkpoint(tmp_path / "a" / "checkpoint-1", two)
    write_checkpoint_marker(ok, 1, world_size=2)
    assert checkpoint_problem(ok) is None
    # rank 1's files never arrived (the marker was written without waiting): incomplete
    short = _checkpoint(
        tmp_path / "b" / "checkpoint-1", [*base, "rng_state_0.pth", "llmgym_signal_state_0.json"]
    )
    write_checkpoint_marker(short, 1, world_size=2)
    assert "rng_state_1.pth is missing" in checkpoint_problem(short) or "llmgym_signal_state_1.json" in (
        checkpoint_problem(short)
    )
    shards = [*two, "optimizer_0/__0_0.distcp", "optimizer_0/.metadata"]
    fsdp = _checkpoint(tmp_path / "c" / "checkpoint-1", shards)
    write_checkpoint_marker(fsdp, 1, world_size=2)
    assert checkpoint_problem(fsdp) == "optimizer_0/__1_0.distcp is missing (saved by 2 processes)"
    single = _checkpoint(tmp_path / "d" / "checkpoint-1", [*base, "rng_state.pth"])
    write_checkpoint_marker(single, 1)
    assert checkpoint_problem(single) is None


def test_other_ranks_take_rank_0s_resume_choice(tiny_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert train_cli.main(_args(tiny_dir, run, "--max_steps", "2")) == 0
    waits, seen = [], {}
    monkeypatch.setattr(train_cli, "_wait_for_ranks", lambda: waits.append(1))
    monkeypatch.setattr(train_cli, "run", lambda config, meta: seen.update(meta) or 0)
    # rank 0 of 2 chooses (and would delete incomplete newer checkpoints), then publishes its choice
    monkeypatch.setattr(train_cli, "_launch_rank", lambda: (0, 2))
    assert train_cli.main([*_args(tiny_dir, run, "--max_steps", "3"), "--resume"]) == 0
    assert seen["resume"] == str(run / "checkpoint-2") and waits == [1]
    # rank 1 never looks at the checkpoints itself: it reads rank 0's choice after the barrier
    publish_resume_choice(run, str(run / "checkpoint-1"))
    monkeypatch.setattr(train_cli, "_launch_rank", lambda: (1, 2))
    monkeypatch.setattr(output, "find_resume_checkpoint", lambda *a: pytest.fail("rank 1 looked"))
    seen.clear()
    assert train_cli.main([*_args(tiny_dir, run, "--max_steps", "3"), "--resume"]) == 0
    assert seen["resume"] == str(run / "checkpoint-1") and waits == [1, 1]
    # rank 0's refusal reaches the other ranks as their error
    publish_resume_choice(run, None, error="--resume: no complete checkpoint")
    with pytest.raises(ValueError, match="no complete checkpoint"):
        read_resume_choice(run)


def test_early_stop_callbacks_round_trip_their_state():
    from types import SimpleNamespace

    from llm_gym.trainer.callbacks import (
        EmptyStopCallback,
        LowSuccessStopCallback,
        RewardStdCollapseCallback,
        StopSignal,
    )
    from llm_gym.trainer.signals import RoundDecision, SignalState

    trainer, stop = SimpleNamespace(last_round=None), StopSignal()
    cb = RewardStdCollapseCallback(trainer, stop, 0.5, 2)
    control = SimpleNamespace(should_training_stop=False)
    for i, std in enumerate((1.0, 0.8, 0.3)):  # baseline from the first two rounds, then one low round
        trainer.last_round = RoundDecision(index=i, batch={}, metrics={"snr/group_std_before": std})
        cb.on_step_end(None, SimpleNamespace(global_step=i + 1), control)
    data = json.loads(json.dumps(cb.state_dict()))
    again = RewardStdCollapseCallback(trainer, stop, 0.5, 2)
    again.load_state_dict(data)
    assert again.base == cb.base == 0.9 and list(again.recent) == [0.3] and again.seen_round == 3
    trainer.last_round = RoundDecision(index=3, batch={}, metrics={"snr/group_std_before": 0.2})
    again.on_step_end(None, SimpleNamespace(global_step=4), control)  # the second low round in a row: stop
    assert control.should_training_stop and "reward std collapsed" in stop.reason
    # the shared stop reason is saved (by the empty-round stop) and stops a resumed run again
    saved = json.loads(json.dumps(EmptyStopCallback(SignalState(), stop).state_dict()))
    fresh = StopSignal()
    EmptyStopCallback(SignalState(), fresh).load_state_dict(saved)
    assert fresh.reason == stop.reason
    low = LowSuccessStopCallback(StopSignal(), 0.5, 3)
    low.on_train_begin(None, SimpleNamespace(global_step=0), control)  # only evaluations inside train() count
    low.on_evaluate(None, SimpleNamespace(global_step=1), control, metrics={"eval_env/success": 0.1})
    restored = LowSuccessStopCallback(StopSignal(), 0.5, 3)
    restored.load_state_dict(json.loads(json.dumps(low.state_dict())))
    assert restored.low == 1
