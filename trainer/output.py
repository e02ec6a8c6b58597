"""Crash safety of a training run's output folder: complete checkpoints, records reconciled on resume.

- A checkpoint is **complete** when its completion marker (``llmgym_checkpoint.json``, written last, after every
  file of the checkpoint was synced to disk) lists files that all still have their recorded sizes. A checkpoint
  without a marker (written by another tool, or a run killed between its last file and the marker) counts as
  complete when its files check out structurally: ``trainer_state.json`` parses (Trainer writes it after the
  weights, optimizer, scheduler and RNG states), a weights file is present, and every safetensors file has the
  size its header declares and every torch file (``*.pt``, ``*.pth``, ``*.bin``: zip archives) ends in its zip
  directory, which a cut-off write lacks.
- ``--resume`` takes the newest complete checkpoint and says which (and why newer ones were skipped).
- On resume, the episode records and the collapse series are cut back to the checkpoint's step: what the killed
  run wrote after the checkpoint is played again, so it would otherwise appear twice.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from llm_gym.safe_io import LOCK_FILE, atomic_path, atomic_write_text, fsync_dir, fsync_file

#: Written into a checkpoint folder after everything else: ``{"global_step": N, "files": {relpath: size}}``.
MARKER = "llmgym_checkpoint.json"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_SAFETENSORS_HEADER_MAX = 100 * 2**20


def write_checkpoint_marker(folder: str | os.PathLike, global_step: int) -> Path:
    """Sync every file of ``folder`` to disk, then write the marker listing them with their sizes."""
    folder = Path(folder)
    files: dict[str, int] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MARKER:
            fsync_file(p)
            files[p.relative_to(folder).as_posix()] = p.stat().st_size
    for d in {p.parent for p in folder.rglob("*")} | {folder}:
        fsync_dir(d)
    marker = folder / MARKER
    atomic_write_text(marker, json.dumps({"global_step": int(global_step), "files": files}, indent=1) + "\n")
    return marker


def _safetensors_problem(p: Path) -> str | None:
    size = p.stat().st_size
    with p.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{p.name} is cut off"
        (n,) = struct.unpack("<Q", head)
        if n > _SAFETENSORS_HEADER_MAX or 8 + n > size:
            return f"{p.name} is cut off"
        try:
            header = json.loads(f.read(n))
            end = max(
                (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError):
            return f"{p.name} has a malformed header"
    return None if size == 8 + n + end else f"{p.name} has {size} bytes, its header declares {8 + n + end}"


def _structural_problem(folder: Path) -> str | None:
    state = folder / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json (the save did not finish)"
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
        int(data["global_step"])
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return "trainer_state.json is cut off or malformed"
    entries = list(folder.iterdir())
    files = [p for p in entries if p.is_file()]
    # weights: safetensors, pytorch_model*.bin, FSDP's pytorch_model_fsdp_N/ or DeepSpeed's global_stepN/ folders
    if not any(
        p.suffix == ".safetensors" or p.name.startswith(("pytorch_model", "global_step")) for p in entries
    ):
        return "no model weights"
    for p in files:
        if p.suffix == ".safetensors":
            problem = _safetensors_problem(p)
        elif p.suffix in (".pt", ".pth", ".bin"):
            problem = None if zipfile.is_zipfile(p) else f"{p.name} is cut off (no zip directory at its end)"
        else:
            continue
        if problem:
            return problem
    return None


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` is not a complete checkpoint, or None when it is (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        return "not a folder"
    marker = folder / MARKER
    if not marker.exists():
        return _structural_problem(folder)
    try:
        files = json.loads(marker.read_text(encoding="utf-8"))["files"]
        items = [(str(k), int(v)) for k, v in files.items()]
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        return f"{MARKER} is malformed"
    for rel, size in items:
        p = folder / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != size:
            return f"{rel} has {p.stat().st_size} bytes, {size} were written"
    return None


def checkpoints(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``checkpoint-N`` folder in ``output_dir``, newest first."""
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def find_resume_checkpoint(output_dir: str | os.PathLike) -> tuple[Path | None, list[tuple[str, str]]]:
    """The newest complete checkpoint of ``output_dir`` (or None) and ``(name, problem)`` of the newer ones
    that were skipped."""
    skipped = []
    for _, folder in checkpoints(output_dir):
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder, skipped
        skipped.append((folder.name, problem))
    return None, skipped


def checkpoint_step(folder: str | os.PathLike) -> int:
    """The global step a (complete) checkpoint was saved at."""
    data = json.loads((Path(folder) / "trainer_state.json").read_text(encoding="utf-8"))
    return int(data["global_step"])


class CheckpointMarkerCallback(TrainerCallback):
    """Writes the completion marker once Trainer has saved a checkpoint (``on_save`` comes after the whole
    save). ``wait`` (the accelerator's ``wait_for_everyone``) lets every process finish its files first."""

    def __init__(self, wait: Callable[[], None] | None = None) -> None:
        self.wait = wait

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.wait is not None:
            self.wait()
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if args.should_save and folder.is_dir():
            write_checkpoint_marker(folder, state.global_step)


# ------------------------------------------------------------------------------------------ records on resume
def _keep_record(meta: Any, step: int) -> bool:
    """Whether a record written before the kill belongs to the run up to checkpoint ``step``.

    Training rounds are generated at ``global_step`` s for step s + 1: a round with s >= step is generated
    again after the resume. An evaluation at step s <= step (0 < s) ran before the checkpoint was saved; the
    one before training (step 0) runs again on every start."""
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        return True
    s = meta["step"]
    if meta.get("mode") == "eval":
        return 0 < s <= step
    return s < step


def _lines(path: Path, keep: Callable[[dict], bool]) -> Iterator[tuple[bytes, str]]:
    """``(line, verdict)`` for each non-blank line: ``"keep"``, ``"drop"`` or ``"torn"`` (a torn last line)."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                if not raw.endswith(b"\n"):
                    yield raw, "torn"
                    continue
                raise ValueError(
                    f"{path}: line {lineno} is not valid JSON; cannot reconcile it on resume"
                ) from None
            yield raw, "drop" if isinstance(row, dict) and not keep(row) else "keep"


def _filter_jsonl(path: Path, keep: Callable[[dict], bool]) -> tuple[int, bool]:
    """Rewrite ``path`` (atomically, streaming: records files can be large) with only the lines ``keep``
    accepts; a torn last line is dropped. Returns ``(lines dropped, whether a torn line was dropped)``; the
    file is untouched when nothing goes."""
    verdicts = Counter(v for _, v in _lines(path, keep))
    if verdicts["drop"] or verdicts["torn"]:
        with atomic_path(path) as tmp, tmp.open("wb") as f:
            for raw, verdict in _lines(path, keep):
                if verdict == "keep":
                    f.write(raw if raw.endswith(b"\n") else raw + b"\n")
    return verdicts["drop"], bool(verdicts["torn"])


def reconcile_after_resume(config: Any, step: int, log: Callable[[str], None] = print) -> None:
    """Cut the run's episode records and collapse series back to checkpoint ``step`` (see :func:`_keep_record`)."""
    out = Path(config.output_dir)
    name = config.episode_records
    if name:
        path = Path(name) if os.path.isabs(name) else out / name
        if path.is_file():
            dropped, torn = _filter_jsonl(path, lambda r: _keep_record(r.get("meta"), step))
            if dropped or torn:
                log(
                    f"llmgym-train: {path.name}: dropped {dropped} record(s) written after step {step}"
                    + (" and a torn last line" if torn else "")
                    + " (they are played again)"
                )
    if config.collapse_report:
        path = out / config.collapse_report
        if path.is_file():
            dropped, torn = _filter_jsonl(
                path, lambda r: not (isinstance(r.get("step"), int) and r["step"] > step)
            )
            if dropped or torn:
                log(f"llmgym-train: {path.name}: dropped {dropped} row(s) logged after step {step}")


# ------------------------------------------------------------------------------------------ the output folder
def resolve_resume(output_dir: str | os.PathLike, resume: str, log: Callable[[str], None] = print) -> Path:
    """The checkpoint ``--resume`` continues from (``"latest"``: the newest complete one), with a log line
    saying which. Incomplete checkpoints newer than it are removed (the resumed run writes them again).

    Raises ``ValueError`` when there is none, the named one is incomplete, or a complete checkpoint is newer
    than the named one (resuming would overwrite it)."""
    out = Path(output_dir)
    if resume == "latest":
        folder, skipped = find_resume_checkpoint(out)
        if folder is None:
            why = "".join(f"; {name}: {problem}" for name, problem in skipped)
            raise ValueError(
                f"--resume: no complete checkpoint in {out}{why} (checkpoints are written with --save_strategy "
                "steps --save_steps N)"
            )
    else:
        folder = Path(resume)
        problem = checkpoint_problem(folder)
        if problem is not None:
            raise ValueError(f"--resume {resume}: not a complete checkpoint ({problem})")
        skipped = []
    step = checkpoint_step(folder)
    same_run = folder.resolve().parent == out.resolve()
    for s, other in checkpoints(out) if same_run else []:
        if s <= step or other.resolve() == folder.resolve():
            continue
        problem = checkpoint_problem(other)
        if problem is None:
            raise ValueError(
                f"--resume {resume}: {other.name} is newer and complete; resuming from step {step} would "
                f"overwrite it (move it out of {out} first)"
            )
        shutil.rmtree(other)
    note = "".join(f"; skipped {name}: {problem}" for name, problem in skipped)
    log(f"llmgym-train: resuming from {folder} (step {step}){note}")
    return folder


#: What ``--overwrite_output_dir`` removes: the training output llm-gym writes (other files stay).
def training_outputs(config: Any) -> list[Path]:
    out = Path(config.output_dir)
    # README.md: the model card TRL writes at each save
    names = ["final", "eval_report.json", "README.md", config.episode_records, config.collapse_report]
    if config.collapse_report:
        names.append(str(Path(config.collapse_report).with_suffix(".png")))
    paths = [out / n for n in names if n and not os.path.isabs(n)]
    return [p for p in paths if p.exists()] + [folder for _, folder in checkpoints(out)]


def prepare_output_dir(
    config: Any, resume: str | None, overwrite: bool, log: Callable[[str], None] = print
) -> str | None:
    """Check the output folder before the model loads (the caller holds its lock); returns the checkpoint to
    resume from. A non-empty folder needs ``--resume`` (continue its run) or ``--overwrite_output_dir``
    (its training output is removed first); resuming cuts its records back to the checkpoint."""
    out = Path(config.output_dir)
    if resume and overwrite:
        raise ValueError("--resume and --overwrite_output_dir exclude each other")
    if resume:
        folder = resolve_resume(out, resume, log)
        reconcile_after_resume(config, checkpoint_step(folder), log)
        return str(folder)
    entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE) if out.is_dir() else []
    if entries and not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ValueError(
            f"output folder {out} is not empty ({shown}); pass --resume to continue its run or "
            "--overwrite_output_dir to replace its training output"
        )
    if overwrite:
        removed = training_outputs(config)
        for p in removed:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        if removed:
            log(
                f"llmgym-train: --overwrite_output_dir removed {', '.join(p.name for p in removed)} from {out}"
            )
    return None
