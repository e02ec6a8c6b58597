"""Crash safety of every command's output (issue 16, items 2-5, 13, 15): complete checkpoints on resume,
records reconciled to the resumed step, one run per output folder, NaN-safe summaries, clear errors before the
model loads, and I/O errors that end in one line, exit code 1 and no partial file.

A full disk is simulated by making ``os.fsync`` (where a delayed-allocation ENOSPC surfaces) or a writer raise
``OSError(ENOSPC)``; a torn file by cutting real files of a tiny run short.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gym import safe_io
from llm_gym.agent.records import (
    EpisodeRecord,
    TornRecordWarning,
    TurnRecord,
    read_records,
    repair_torn_tail,
    write_records,
)
from llm_gym.safe_io import (
    LOCK_FILE,
    OutputLock,
    OutputLockedError,
    append_text,
    atomic_write,
    atomic_write_text,
)

REPO = Path(__file__).resolve().parents[1]


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _leftovers(folder: Path) -> list[str]:
    """Temporary files an atomic write would leave behind if it failed to clean up."""
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def _record(i: int, **meta) -> EpisodeRecord:
    rec = EpisodeRecord(env_id="llmgym/Bandit-v0", seed=i, initial_observation=f"obs {i}", meta=dict(meta))
    rec.turns.append(TurnRecord("<answer>A</answer>", "done", 1.0, terminated=True, info={"success": True}))
    return rec


# ------------------------------------------------------------------------------------------ the shared helper
def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write("half of the new")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old\n" and _leftovers(tmp_path) == []
    monkeypatch.setattr(os, "fsync", _enospc)  # the disk fills: the error surfaces at fsync
    with pytest.raises(OSError, match="No space"):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n" and _leftovers(tmp_path) == []
    monkeypatch.undo()
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and _leftovers(tmp_path) == []
    with pytest.raises(OSError):  # an output path under a file
        atomic_write_text(target / "x.json", "{}")


def test_atomic_dir_replaces_a_folder_only_when_complete(tmp_path):
    target = tmp_path / "dataset"
    target.mkdir()
    (target / "old.arrow").write_text("old")
    with pytest.raises(OSError), safe_io.atomic_dir(target) as tmp:
        tmp.mkdir()
        (tmp / "data-00000.arrow").write_text("half")
        _enospc()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]
    assert [p.name for p in target.iterdir()] == ["old.arrow"]
    with safe_io.atomic_dir(target) as tmp:
        tmp.mkdir()
        (tmp / "new.arrow").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]  # no temporary or old folder left
    assert [p.name for p in target.iterdir()] == ["new.arrow"]


class _HalfWriter:
    """A binary file whose writes store half the bytes and then fail as a full disk does."""

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def seek(self, *a):
        return self.f.seek(*a)

    def truncate(self, size):
        return self.f.truncate(size)

    def read(self, *a):
        return self.f.read(*a)

    def flush(self):
        self.f.flush()

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        _enospc()


def test_a_failed_append_leaves_no_torn_record(tmp_path, monkeypatch):
    path = tmp_path / "episodes.jsonl"
    write_records(path, [_record(0), _record(1)])
    before = path.read_bytes()
    real = safe_io._append_file
    monkeypatch.setattr(safe_io, "_append_file", lambda p: _HalfWriter(real(p)))
    with pytest.raises(OSError, match="No space"):
        write_records(path, [_record(2)])
    assert path.read_bytes() == before  # cut back: no torn line
    monkeypatch.undo()
    with pytest.raises(OSError):
        append_text(tmp_path / "episodes.jsonl" / "x", "x\n")


def test_append_after_a_complete_last_line_without_newline_starts_a_new_line(tmp_path):
    path = tmp_path / "episodes.jsonl"
    write_records(path, [_record(0)])
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # killed between the record and its newline
    write_records(path, [_record(1)])
    write_records(path, [_record(2)])
    assert [r.seed for r in read_records(path)] == [0, 1, 2]
    append_text(tmp_path / "new.txt", "a")  # a fresh file gets no newline of ours
    assert (tmp_path / "new.txt").read_bytes() == b"a"


def test_resume_reconcile_ends_a_complete_last_line_without_newline(tmp_path):
    from types import SimpleNamespace

    from llm_gym.trainer.output import reconcile_after_resume

    path = tmp_path / "episodes.jsonl"
    write_records(path, [_record(0), _record(1)])
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    cfg = SimpleNamespace(output_dir=str(tmp_path), episode_records="episodes.jsonl", collapse_report=None)
    reconcile_after_resume(cfg, 5, log=lambda m: None)  # nothing to drop: the file still gets its newline
    assert path.read_bytes().endswith(b"}\n")
    with path.open("ab") as f:  # a plain append (the next run's records) no longer joins two records
        f.write(path.read_bytes().splitlines(keepends=True)[0])
    assert [r.seed for r in read_records(path)] == [0, 1, 0]


# ------------------------------------------------------------------------------------------ torn last line
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 4), cut=st.floats(0.0, 1.0, exclude_max=True))
def test_a_torn_last_line_is_skipped_and_reported(tmp_path_factory, n, cut):
    path = tmp_path_factory.mktemp("torn") / "episodes.jsonl"
    write_records(path, [_record(i) for i in range(n)])
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    keep = last_start + int(cut * (len(data) - 1 - last_start))  # somewhere inside the last line
    path.write_bytes(data[:keep])
    seen = []
    records = read_records(path, on_torn=seen.append)
    assert [r.seed for r in records] == list(range(n - 1))
    assert (len(seen) == 1 and "torn last line" in seen[0]) == (keep > last_start)
    removed = repair_torn_tail(path)
    assert removed == keep - last_start and path.read_bytes() == data[:last_start]
    write_records(path, [_record(9)])  # appending after the repair gives whole lines again
    assert [r.seed for r in read_records(path)] == [*range(n - 1), 9]


def test_torn_line_warns_by_default_and_a_bad_middle_line_is_still_an_error(tmp_path):
    path = tmp_path / "e.jsonl"
    write_records(path, [_record(0), _record(1)])
    with path.open("ab") as f:
        f.write(b'{"env_id": "llmgym/Bandit-v0", "se')
    with pytest.warns(TornRecordWarning, match="line 3"):
        assert len(read_records(path)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"env_id": "llmgym/Band\n' + path.read_bytes())
    with pytest.raises(ValueError, match="bad episode record at line 1"):
        read_records(bad)
    complete = tmp_path / "c.jsonl"  # a complete last record without its newline is not torn
    complete.write_bytes(path.read_bytes().split(b"\n")[0])
    assert len(read_records(complete)) == 1
    assert repair_torn_tail(complete) == 0 and complete.read_bytes().endswith(b"\n")


GOOD = "<think>go right</think><answer>Right</answer>"


def _played(path: Path, seeds=(0, 1)) -> None:
    from llm_gym.agent.rollout import rollout

    records = rollout("llmgym/FrozenLakeDeterministic-v0", list(seeds), lambda batch: [GOOD] * len(batch))
    write_records(path, records)


def test_render_reports_a_torn_last_line_and_renders_the_rest(tmp_path, capsys):
    from llm_gym.cli import main

    path = tmp_path / "episodes.jsonl"
    _played(path)
    with path.open("ab") as f:
        f.write(b'{"env_id": "llmgym/FrozenLakeDeterministic-v0", "turns": [{"resp')
    out = tmp_path / "ep.gif"
    assert main(["render", str(path), "--out", str(out), "--episode", "-1"]) == 0
    err = capsys.readouterr().err
    assert "torn last line (line 3" in err and out.stat().st_size > 0


# ------------------------------------------------------------------------------------------ the output lock
_HOLDER = textwrap.dedent(
    """
    import sys, time
    from llm_gym.safe_io import OutputLock
    OutputLock(sys.argv[1]).acquire()
    print("locked", flush=True)
    time.sleep(60)
    """
)


def _hold_lock(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_output_lock_is_exclusive_names_the_holder_and_dies_with_it(tmp_path):
    folder = tmp_path / "run"
    with OutputLock(folder):
        with pytest.raises(OutputLockedError, match=f"pid {os.getpid()}"):
            OutputLock(folder).acquire()
    OutputLock(folder).acquire().release()  # released: free again
    proc = _hold_lock(folder)
    try:
        with pytest.raises(OutputLockedError, match=f"pid {proc.pid}"):
            OutputLock(folder).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (folder / LOCK_FILE).exists()  # the stale file of a killed holder does not block
    OutputLock(folder).acquire().release()


# ------------------------------------------------------------------------------------------ llmgym, collapse report
def test_render_full_disk_is_one_line_exit_1_and_no_partial_file(tmp_path, capsys, monkeypatch):
    import llm_gym.render.export as render_export
    from llm_gym.cli import main

    path = tmp_path / "episodes.jsonl"
    _played(path)

    def half_gif(record, out, **kwargs):
        Path(out).write_bytes(b"GIF89a" + b"\0" * 100)  # the writer got this far
        _enospc()

    monkeypatch.setattr(render_export, "export_episode", half_gif)
    out = tmp_path / "ep.gif"
    assert main(["render", str(path), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert "No space left on device" in err and len(err.splitlines()) == 1
    assert not out.exists() and _leftovers(tmp_path) == []
    monkeypatch.undo()
    assert main(["render", str(path), "--out", str(path / "ep.gif")]) == 1  # an output path under a file
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_export_full_disk_leaves_no_partial_jsonl(tmp_path, capsys, monkeypatch):
    from llm_gym.cli import main

    out = tmp_path / "expert.jsonl"
    monkeypatch.setattr(os, "fsync", _enospc)
    assert main(["export", "--env", "FrozenLakeDeterministic", "--out", str(out), "--num_episodes", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "No space left on device" in err and len(err.splitlines()) == 1
    assert not out.exists() and _leftovers(tmp_path) == []


def test_collapse_report_full_disk_leaves_no_partial_png(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from llm_gym.trainer.collapse_report import main
    from matplotlib.figure import Figure

    series = tmp_path / "collapse.jsonl"
    series.write_text(
        "".join(json.dumps({"step": s, "mi/trajectory/mi_zscore_ema": 1.0 / s}) + "\n" for s in (1, 2))
    )
    with series.open("a") as f:
        f.write('{"step": 3, "mi/traj')  # torn by a kill: skipped with a warning

    def half_png(self, fname, **kwargs):
        Path(fname).write_bytes(b"\x89PNG" + b"\0" * 100)
        _enospc()

    monkeypatch.setattr(Figure, "savefig", half_png)
    out = tmp_path / "c.png"
    assert main([str(tmp_path), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "torn last line" in err and "No space left on device" in err
    assert not out.exists() and _leftovers(tmp_path) == []
    monkeypatch.undo()
    assert main([str(tmp_path), "--out", str(out)]) == 0 and out.read_bytes().startswith(b"\x89PNG")


# ------------------------------------------------------------------------------------------ llmgym-eval
@pytest.fixture
def scripted_eval(monkeypatch):
    pytest.importorskip("transformers")
    import llm_gym.trainer.evaluate as ev

    monkeypatch.setattr(ev, "make_policy", lambda a: (lambda batch: [GOOD] * len(batch), "scripted"))
    return ev.main


def _eval_args(out: Path) -> list[str]:
    return [
        "--model",
        "scripted",
        "--env",
        "FrozenLakeDeterministic",
        "--num_eval_seeds",
        "3",
        "-o",
        str(out),
    ]


def test_eval_resume_repairs_a_torn_last_line(tmp_path, capsys, scripted_eval):
    out = tmp_path / "ev"
    assert scripted_eval([*_eval_args(out), "--no_progress"]) == 0
    episodes = out / "episodes.jsonl"
    lines = episodes.read_bytes().splitlines(keepends=True)
    episodes.write_bytes(b"".join(lines[:2]) + lines[2][:40])  # killed while writing the third episode
    assert scripted_eval([*_eval_args(out), "--no_progress", "--resume"]) == 0
    assert "removed a torn last line" in capsys.readouterr().err
    assert sorted(r.seed for r in read_records(episodes)) == [123, 124, 125]  # the torn one played again


def test_eval_refuses_a_folder_in_use_and_full_disk_is_exit_1(tmp_path, capsys, scripted_eval, monkeypatch):
    out = tmp_path / "ev"
    proc = _hold_lock(out)
    try:
        assert scripted_eval([*_eval_args(out), "--no_progress"]) == 2
        assert f"in use by another llm-gym evaluation (pid {proc.pid})" in capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    monkeypatch.setattr(os, "fsync", _enospc)
    assert scripted_eval([*_eval_args(out), "--no_progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert "No space left on device" in err and len(err.splitlines()) == 1
    assert not (out / "summary.json").exists() and _leftovers(out) == []


# ------------------------------------------------------------------------------------------ llmgym-train
pytest.importorskip("trl")

import llm_gym.trainer.cli as train_cli  # noqa: E402
import llm_gym.trainer.models as models  # noqa: E402
from llm_gym.trainer.output import (  # noqa: E402
    MARKER,
    checkpoint_problem,
    prepare_output_dir,
    resolve_resume,
)

from tests._tiny import tiny_train_argv  # noqa: E402


def _train_args(tiny_dir, out: Path) -> list[str]:
    return tiny_train_argv(tiny_dir, out, num_eval_seeds=2)


def _groups(run: Path) -> Counter:
    return Counter((r.meta["mode"], r.meta["step"]) for r in read_records(run / "episodes.jsonl"))


@pytest.fixture(scope="module")
def trained(tiny_dir, tmp_path_factory):
    """A finished 2-step run with checkpoint-1 and checkpoint-2 (copy it before changing it)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert train_cli.main([*_train_args(tiny_dir, run), "--max_steps", "2"]) == 0
    return run


@pytest.fixture
def no_model_load(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr(models, "load_model_and_tokenizer", boom)


def test_checkpoints_get_a_marker_and_a_cut_file_makes_them_incomplete(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    ckpt = run / "checkpoint-2"
    listed = json.loads((ckpt / MARKER).read_text())["files"]
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(listed)
    assert checkpoint_problem(ckpt) is None
    opt = ckpt / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:-10])
    assert "optimizer.pt has" in checkpoint_problem(ckpt)
    (ckpt / MARKER).unlink()  # without the marker, the files themselves are checked
    assert "optimizer.pt is cut off" in checkpoint_problem(ckpt)
    weights = run / "checkpoint-1" / "model.safetensors"
    (run / "checkpoint-1" / MARKER).unlink()
    # our run folder: every checkpoint gets a marker, so complete-looking files without one are a save that did
    # not finish (another rank's RNG state or optimizer shard may be missing)
    assert "no llmgym_checkpoint.json" in checkpoint_problem(run / "checkpoint-1")
    for bookkeeping in (".llmgym.lock", "llmgym_run.json"):
        (run / bookkeeping).unlink()
    # another tool's run folder: complete files, no marker: still complete
    assert checkpoint_problem(run / "checkpoint-1") is None
    weights.write_bytes(weights.read_bytes()[:1000])
    assert "model.safetensors" in checkpoint_problem(run / "checkpoint-1")
    (run / "checkpoint-1" / "trainer_state.json").unlink()
    assert "trainer_state.json" in checkpoint_problem(run / "checkpoint-1")


def test_resume_skips_a_torn_checkpoint_and_cuts_records_back(trained, tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    reference = _groups(run)
    # Killed while writing checkpoint-2: a cut optimizer file, no marker; the records file ends in a torn line.
    opt = run / "checkpoint-2" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[: opt.stat().st_size // 2])
    (run / "checkpoint-2" / MARKER).unlink()
    with (run / "episodes.jsonl").open("ab") as f:
        f.write(b'{"env_id": "llmgym/Bandit-v0", "seed": 3, "tur')
    assert train_cli.main([*_train_args(tiny_dir, run), "--max_steps", "2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert (
        f"resuming from {run / 'checkpoint-1'} (step 1); skipped checkpoint-2: optimizer.pt is cut off" in out
    )
    assert "dropped" in out and "torn last line" in out
    assert _groups(run) == reference  # every round and evaluation exactly once
    assert checkpoint_problem(run / "checkpoint-2") is None


def test_non_empty_output_needs_resume_or_overwrite(trained, tiny_dir, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    monkeypatch.setattr(models, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("model loaded"))
    assert train_cli.main([*_train_args(tiny_dir, run), "--max_steps", "1"]) == 2
    assert "is not empty" in capsys.readouterr().err
    seen = {}
    monkeypatch.setattr(train_cli, "run", lambda config, meta: seen.update(meta) or 0)
    assert train_cli.main([*_train_args(tiny_dir, run), "--max_steps", "1", "--overwrite_output_dir"]) == 0
    assert seen["resume"] is None
    # only the lock file is left, and the new run's settings (llmgym_run.json) are written
    assert sorted(p.name for p in run.iterdir()) == sorted([LOCK_FILE, "llmgym_run.json"])
    args = [*_train_args(tiny_dir, run), "--resume", "--overwrite_output_dir"]
    assert train_cli.main(args) == 2


def test_resume_from_an_older_checkpoint_never_overwrites_a_newer_complete_one(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    with pytest.raises(ValueError, match="checkpoint-2 is newer and complete"):
        resolve_resume(run, str(run / "checkpoint-1"), log=lambda m: None)
    (run / "checkpoint-2" / "trainer_state.json").unlink()
    (run / "checkpoint-2" / MARKER).unlink()
    assert resolve_resume(run, str(run / "checkpoint-1"), log=lambda m: None) == run / "checkpoint-1"
    assert not (run / "checkpoint-2").exists()  # the torn one is removed: the resumed run writes it again


def test_resume_at_max_steps_trains_no_step_and_swaps_final_in_whole(trained, tiny_dir, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    reference = _groups(run)
    # The tiny run's rewards are all equal (zero advantages): its steps leave the weights as loaded. Mark the
    # checkpoint's weights, so that final/ equals them only if the resume loaded them (same size: still complete).
    weights = run / "checkpoint-2" / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, str(weights), metadata=metadata)
    assert checkpoint_problem(run / "checkpoint-2") is None
    # Killed while saving final/ (after checkpoint-2 = max_steps): a half-written save beside it, no final/.
    shutil.rmtree(run / "final")
    (run / ".final.partial").mkdir()
    (run / ".final.partial" / "model.safetensors").write_bytes(b"cut")
    assert train_cli.main([*_train_args(tiny_dir, run), "--max_steps", "2", "--resume"]) == 0
    assert "no step left to train" in capsys.readouterr().out
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]  # no step 3
    assert _groups(run) == reference  # no train round at step 2, the final evaluation once
    assert not (run / ".final.partial").exists() and (run / "final" / "llmgym_run.json").is_file()
    final, ckpt = (
        load_file(run / "final" / "model.safetensors"),
        load_file(run / "checkpoint-2" / "model.safetensors"),
    )
    assert final.keys() == ckpt.keys() and all(
        torch_equal(final[k], ckpt[k]) for k in final
    )  # the trained model


def test_resume_refuses_a_linked_model_card_and_clears_a_cut_final_swap(
    trained, tiny_dir, tmp_path, capsys, no_model_load
):
    from types import SimpleNamespace

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    # TRL writes the model card with open(path, "w") at every checkpoint: a planted link had its target overwritten
    (run / "README.md").unlink()
    (run / "README.md").symlink_to(victim)
    records = (run / "episodes.jsonl").read_bytes()
    assert train_cli.main([*_train_args(tiny_dir, run), "--max_steps", "3", "--resume"]) == 1
    assert "refusing to write through a symbolic link" in capsys.readouterr().err
    assert (
        victim.read_text() == "precious\n" and (run / "episodes.jsonl").read_bytes() == records
    )  # untouched
    # a kill between the two renames of final/'s swap leaves the old model beside it: a resume removes it
    (run / "README.md").unlink()
    (run / ".final.old-1-abcd").mkdir()
    (run / ".final.old-1-abcd" / "model.safetensors").write_bytes(b"old")
    config = SimpleNamespace(
        output_dir=str(run), episode_records="episodes.jsonl", collapse_report="collapse.jsonl", max_steps=2
    )
    prepare_output_dir(config, "latest", False, log=lambda m: None)
    assert not (run / ".final.old-1-abcd").exists() and (run / "final").is_dir()


def test_a_resume_on_more_processes_gives_the_new_ones_rank_0s_shared_state(tmp_path):
    # A 2-process run resumed on 4: ranks 2 and 3 had no state file, restarted their round count, ran MI rounds
    # the others did not, and the run crashed in gloo (a hang under NCCL). They now take rank 0's shared counters.
    from llm_gym.trainer.output import PER_PROCESS_SIGNAL_FIELDS, read_resume_state
    from llm_gym.trainer.signals import SignalState

    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    for rank in (0, 1):
        state = SignalState.for_process(seed=7, process_index=rank)
        state.rounds, state.consecutive_empty = 2, 2
        data = {"signal_state": state.state_dict(), "generation_rounds": 2, "callbacks": {"X": {"low": 1}}}
        (ckpt / f"llmgym_signal_state_{rank}.json").write_text(json.dumps(data))
    own, borrowed = read_resume_state(ckpt, 1)
    assert not borrowed and own["signal_state"]["rng"] == SignalState.for_process(7, 1).state_dict()["rng"]
    new, borrowed = read_resume_state(ckpt, 3)
    assert borrowed and new["generation_rounds"] == 2 and new["callbacks"] == {"X": {"low": 1}}
    assert new["signal_state"]["rounds"] == 2 and new["signal_state"]["consecutive_empty"] == 2
    assert not set(PER_PROCESS_SIGNAL_FIELDS) & set(new["signal_state"])  # its own sampling starts afresh
    fresh = SignalState.for_process(seed=7, process_index=3)
    fresh.load_state_dict(new["signal_state"])
    assert (
        fresh.rounds == 2
        and fresh.rng.bit_generator.state == SignalState.for_process(7, 3).rng.bit_generator.state
    )
    assert read_resume_state(tmp_path, 0) == (
        None,
        False,
    )  # an older llm-gym's checkpoint: nothing to restore


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_final_is_replaced_only_when_the_save_completed(tmp_path):
    from types import SimpleNamespace

    from llm_gym.trainer.output import save_final

    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    (out / "final" / "model.safetensors").write_bytes(b"old")
    victim = tmp_path / "victim"
    victim.mkdir()

    def save_model(folder, fail=False):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"new")
        if fail:
            _enospc()

    acc = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    config = SimpleNamespace(output_dir=str(out), env="llmgym/Bandit-v0", make_env_kwargs=dict)
    from llm_gym.trainer.output import RUN_CHAT_FIELDS

    for name in RUN_CHAT_FIELDS:
        setattr(config, name, None)
    failing = SimpleNamespace(accelerator=acc, save_model=lambda f: save_model(f, fail=True))
    with pytest.raises(OSError, match="No space"):
        save_final(failing, config)
    assert (out / "final" / "model.safetensors").read_bytes() == b"old"  # the previous final/ is untouched
    ok = SimpleNamespace(accelerator=acc, save_model=save_model)
    assert save_final(ok, config) == out / "final"  # the leftover .final.partial is cleared first
    assert (out / "final" / "model.safetensors").read_bytes() == b"new" and (
        out / "final" / "llmgym_run.json"
    ).is_file()
    assert sorted(p.name for p in out.iterdir()) == ["final"]
    # a planted final -> elsewhere link is replaced itself; what it points to is never written
    shutil.rmtree(out / "final")
    (out / "final").symlink_to(victim)
    save_final(ok, config)
    assert not (out / "final").is_symlink() and list(victim.iterdir()) == []


def test_a_second_run_on_a_locked_output_folder_fails_naming_the_pid(
    tiny_dir, tmp_path, capsys, no_model_load
):
    run = tmp_path / "run"
    proc = _hold_lock(run)
    try:
        assert train_cli.main([*_train_args(tiny_dir, run), "--max_steps", "1"]) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert f"in use by another llm-gym training run (pid {proc.pid})" in capsys.readouterr().err


def test_bad_options_fail_before_the_model_loads(tiny_dir, tmp_path, capsys, no_model_load):
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_dir, no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / name).unlink(missing_ok=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["--env_kwargs", '{"bogus": 1}'], "unexpected keyword argument 'bogus'"),
        (["--temperature", "0"], "temperature must be > 0"),
        (["--learning_rate", "nan"], "learning_rate must be a finite number"),
        (["--resume"], "does not exist"),
        (["--output_dir", str(empty), "--resume"], "no complete checkpoint"),
        (["--model", str(no_tokenizer)], "has no tokenizer files"),
    ]
    for extra, message in cases:
        argv = ["--env", "Bandit", "--model", str(tiny_dir), "-o", str(tmp_path / "never"), *extra]
        assert train_cli.main(argv) == 2, extra
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "never").exists()


def test_train_io_errors_are_one_line_exit_1(tiny_dir, tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    monkeypatch.setattr(models, "load_model_and_tokenizer", lambda *a, **k: pytest.fail("model loaded"))
    assert train_cli.main([*_train_args(tiny_dir, a_file / "run"), "--max_steps", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("llmgym-train: error:") and len(err.splitlines()) == 1


def test_full_disk_while_training_is_exit_1_without_torn_records(tiny_dir, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    real = safe_io._append_file
    monkeypatch.setattr(safe_io, "_append_file", lambda p: _HalfWriter(real(p)))
    assert train_cli.main([*_train_args(tiny_dir, run), "--max_steps", "1", "--num_eval_seeds", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    episodes = run / "episodes.jsonl"
    assert err[-1] == f"llmgym-train: error: [Errno 28] No space left on device: {str(episodes)!r}"
    assert not episodes.exists() or episodes.read_bytes() == b""


def test_full_disk_while_saving_a_checkpoint_is_exit_1_and_resume_skips_it(
    tiny_dir, tmp_path, capsys, monkeypatch
):
    import torch

    real = torch.save

    def save(obj, f, *a, **k):
        if str(f).endswith(os.path.join("checkpoint-2", "optimizer.pt")):
            Path(f).write_bytes(b"PK\x03\x04" + b"\0" * 64)  # what got written before the disk filled
            raise RuntimeError(
                "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file data/0: "
                "file write failed"
            )
        return real(obj, f, *a, **k)

    run = tmp_path / "run"
    args = [*_train_args(tiny_dir, run), "--max_steps", "2", "--num_eval_seeds", "0"]
    monkeypatch.setattr(torch, "save", save)
    assert train_cli.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("llmgym-train: error:") and "failed writing" in err[-1]
    monkeypatch.undo()
    assert train_cli.main([*args, "--resume"]) == 0
    assert "(step 1); skipped checkpoint-2: no trainer_state.json" in capsys.readouterr().out
    assert checkpoint_problem(run / "checkpoint-2") is None


def test_nan_rewards_from_every_function_end_in_a_summary(tiny_dir, tmp_path, capsys, monkeypatch):
    import llm_gym.trainer.grpo as grpo

    monkeypatch.setattr(grpo, "env_reward", lambda completions, **kw: [math.nan] * len(completions))
    argv = [*_train_args(tiny_dir, tmp_path / "run"), "--max_steps", "1", "--disable_tqdm", "False"]
    assert train_cli.main(argv) == 0  # was a TypeError formatting None (progress bar, then the summary)
    assert "last train reward n/a" in capsys.readouterr().out


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    real = torch.save

    def save(obj, f, *a, **k):
        real(obj, f, *a, **k)
        if str(f).endswith(os.path.join("checkpoint-2", "optimizer.pt")):
            with open(f, "r+b") as fh:  # the kill lands while the file is half written
                fh.truncate(os.path.getsize(f) // 2)
            os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save
    from llm_gym.trainer.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_sigkill_while_saving_a_checkpoint_then_resume(tiny_dir, tmp_path, capsys):
    run = tmp_path / "run"
    args = [*_train_args(tiny_dir, run), "--max_steps", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _KILLER, *args], cwd=REPO, env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert checkpoint_problem(run / "checkpoint-2") is not None
    assert train_cli.main([*args, "--resume"]) == 0
    assert f"resuming from {run / 'checkpoint-1'} (step 1)" in capsys.readouterr().out
    groups = _groups(run)
    assert sorted(k for k in groups if k[0] == "train") == [("train", 0), ("train", 1), ("train", 2)]
    assert sorted(k for k in groups if k[0] == "eval") == [("eval", 0), ("eval", 3)]
    assert len({n for k, n in groups.items() if k[0] == "train"}) == 1  # no round twice
    assert len({n for k, n in groups.items() if k[0] == "eval"}) == 1


@pytest.mark.slow
def test_a_two_process_run_resumes_on_four(tiny_dir, tmp_path):
    # CPU processes (gloo) under accelerate with the shipped FSDP config: resumed on more processes, the new ranks
    # crashed in gloo at the first MI round (their round count restarted); now all four stop on the same step.
    import socket

    pytest.importorskip("accelerate")
    script = Path(sys.executable).with_name("llmgym-train")
    if not script.exists():
        pytest.skip("llmgym-train is not installed next to the interpreter")
    run = tmp_path / "run"

    def launch(processes: int, *extra: str) -> subprocess.CompletedProcess:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = Path(__file__).resolve().parents[1] / "trainer" / "accelerate_configs" / "fsdp.yaml"
        per_device = str(8 // processes)  # 2 seeds x 4 rollouts per round over the processes
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
        cmd += ["--mixed_precision", "no"]
        cmd += ["--num_processes", str(processes), "--main_process_port", str(port), str(script)]
        cmd += [*_train_args(tiny_dir, run), "--per_device_train_batch_size", per_device]
        cmd += ["--per_device_eval_batch_size", per_device, *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)

    first = launch(2, "--max_steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    again = launch(4, "--max_steps", "4", "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "was saved by fewer processes" in again.stderr
    state = json.loads((run / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and (run / "checkpoint-4" / "llmgym_signal_state_3.json").is_file()
