"""Crash safety of a training run's output folder: complete checkpoints, records reconciled on resume.

- A checkpoint is **complete** when its completion marker (``llmgym_checkpoint.json``, written last, after every
  process saved its files and they were synced to disk) lists files that all still have their recorded sizes,
  including each process's own files (``rng_state_N.pth``, ``llmgym_signal_state_N.json``) for the world size it
  records. In a run folder of this llm-gym (it holds the run lock or ``llmgym_run.json``) a checkpoint without
  a marker is incomplete: the run was killed while saving it. Elsewhere (a checkpoint written by another tool)
  a checkpoint without a marker counts as complete when its files check out structurally: ``trainer_state.json`` parses (Trainer writes it after the
  weights, optimizer, scheduler and RNG states), a weights file is present, and every safetensors file has the
  size its header declares and every torch file (``*.pt``, ``*.pth``, ``*.bin``: zip archives) ends in its zip
  directory, which a cut-off write lacks.
- ``--resume`` takes the newest complete checkpoint and says which (and why newer ones were skipped).
- On resume, the episode records and the collapse series are cut back to the checkpoint's step: what the killed
  run wrote after the checkpoint is played again, so it would otherwise appear twice.
- A resume from a checkpoint at ``max_steps`` (a run killed during its final evaluation or while saving
  ``final/``) trains no further step: :func:`load_finished_checkpoint` restores the trained weights and state
  instead of ``Trainer.train``, which would run one more step before it checks ``max_steps``.
- ``final/`` is saved to ``.final.partial/`` and renamed into place (:func:`save_final`).
"""

from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llm_gym.agent.chat import CHAT_SETTINGS, ChatFormat
from llm_gym.safe_io import (
    LOCK_FILE,
    atomic_path,
    atomic_write_text,
    check_regular,
    fsync_dir,
    fsync_file,
    remove_path,
    replace_dir,
)

#: Written into a checkpoint folder after everything else:
#: ``{"global_step": N, "world_size": W, "files": {relpath: size}}``.
MARKER = "llmgym_checkpoint.json"
#: Each process's :class:`~llm_gym.trainer.signals.SignalState` (and early-stop state) in a checkpoint.
SIGNAL_STATE_FILE = "llmgym_signal_state_{rank}.json"
#: Written into the output folder when a run starts, and into ``final/``: the settings ``llmgym-eval`` reuses.
RUN_FILE = "llmgym_run.json"
#: Multi-process runs: rank 0's ``--resume`` choice, read by the other ranks after a barrier.
RESUME_CHOICE_FILE = ".llmgym_resume.json"
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
#: The final model's folder, and where it is saved first (then renamed over it: ``final/`` is whole or absent).
FINAL_DIR = "final"
FINAL_PARTIAL = ".final.partial"
#: Files other libraries write in place in the output folder (``open(path, "w")`` follows a link): TRL's model card,
#: at every checkpoint. A resumed run refuses one that is not a regular file, as for our own appends.
WRITTEN_IN_PLACE = ("README.md",)
_SAFETENSORS_HEADER_MAX = 100 * 2**20


def write_checkpoint_marker(folder: str | os.PathLike, global_step: int, world_size: int = 1) -> Path:
    """Sync every file of ``folder`` to disk, then write the marker listing them with their sizes and the number
    of processes that saved them."""
    folder = Path(folder)
    files: dict[str, int] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MARKER:
            fsync_file(p)
            files[p.relative_to(folder).as_posix()] = p.stat().st_size
    for d in {p.parent for p in folder.rglob("*")} | {folder}:
        fsync_dir(d)
    marker = folder / MARKER
    data = {"global_step": int(global_step), "world_size": int(world_size), "files": files}
    atomic_write_text(marker, json.dumps(data, indent=1) + "\n")
    return marker


#: Fields of a process's saved ``SignalState`` that are its own (its MI pair sampling and copy generators, its
#: local MI averages); the others (round count, empty-round streak) are the same on every process, since every
#: process decides them from the same gathered rewards.
PER_PROCESS_SIGNAL_FIELDS = ("rng", "copy_generator", "ema")


def read_resume_state(checkpoint: str | os.PathLike, rank: int) -> tuple[dict[str, Any] | None, bool]:
    """What process ``rank`` restores from ``checkpoint``: its own :data:`SIGNAL_STATE_FILE` and False, or, when
    the checkpoint was saved by fewer processes (a resume on more), rank 0's without its per-process fields
    (:data:`PER_PROCESS_SIGNAL_FIELDS`, which start afresh) and True; ``(None, False)`` when neither exists (a
    checkpoint of an older llm-gym). Restoring nothing on the new ranks let their round count restart: their MI
    rounds and early stops no longer fell on the other ranks' steps, and the processes' collectives stopped
    matching (a 2-process run resumed on 4 crashed in gloo at the next MI round)."""
    folder = Path(checkpoint)
    own = folder / SIGNAL_STATE_FILE.format(rank=rank)
    borrowed = not own.is_file() and rank > 0
    path = folder / SIGNAL_STATE_FILE.format(rank=0) if borrowed else own
    if not path.is_file():
        return None, False
    data = json.loads(path.read_text(encoding="utf-8"))
    if borrowed:
        shared = {k: v for k, v in data.get("signal_state", {}).items() if k not in PER_PROCESS_SIGNAL_FIELDS}
        data = {**data, "signal_state": shared}
    return data, borrowed


def _per_rank_problem(files: dict[str, int], world_size: int) -> str | None:
    """A file every process writes that the marker does not list for some rank (Trainer names RNG states
    ``rng_state_N.pth`` with several processes; FSDP's sharded optimizer has one ``__N_0.distcp`` per rank)."""
    names = set(files)
    expect = (
        [SIGNAL_STATE_FILE.format(rank=r) for r in range(world_size)]
        if any(n.startswith("llmgym_signal_state_") for n in names)
        else []
    )
    if world_size > 1:
        if any(n.startswith("rng_state") for n in names):
            expect += [f"rng_state_{r}.pth" for r in range(world_size)]
        for folder in sorted({n.split("/", 1)[0] for n in names if n.endswith(".distcp")}):
            expect += [f"{folder}/__{r}_0.distcp" for r in range(world_size)]
    missing = [n for n in expect if n not in names]
    return f"{missing[0]} is missing (saved by {world_size} processes)" if missing else None


def written_by_llmgym(output_dir: str | os.PathLike) -> bool:
    """Whether ``output_dir`` is a training run folder of this llm-gym, whose checkpoints all get a marker."""
    out = Path(output_dir)
    return (out / RUN_FILE).is_file() or (out / LOCK_FILE).is_file()


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
        if written_by_llmgym(folder.parent):
            # our runs write the marker after every process's files: without it the save did not finish (the
            # files alone cannot show that another process's RNG state or optimizer shard is missing)
            return _structural_problem(folder) or f"no {MARKER} (the run was stopped while saving it)"
        return _structural_problem(folder)
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
        files = data["files"]
        items = [(str(k), int(v)) for k, v in files.items()]
        world_size = int(data.get("world_size", 1))
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
        return f"{MARKER} is malformed"
    problem = _per_rank_problem(dict(items), world_size)
    if problem:
        return problem
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
    skipped: list[tuple[str, str]] = []
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


def _ends_in_newline(path: Path) -> bool:
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return True
        f.seek(size - 1)
        return f.read(1) == b"\n"


def _filter_jsonl(path: Path, keep: Callable[[dict], bool]) -> tuple[int, bool]:
    """Rewrite ``path`` (atomically, streaming: records files can be large) with only the lines ``keep``
    accepts; a torn last line is dropped. Returns ``(lines dropped, whether a torn line was dropped)``; the
    file is untouched when nothing goes."""
    verdicts = Counter(v for _, v in _lines(path, keep))
    # a complete last line without its newline is rewritten with one: the next append would join it
    if verdicts["drop"] or verdicts["torn"] or not _ends_in_newline(path):
        with atomic_path(path) as tmp, tmp.open("wb") as f:
            for raw, verdict in _lines(path, keep):
                if verdict == "keep":
                    f.write(raw if raw.endswith(b"\n") else raw + b"\n")
    return verdicts["drop"], bool(verdicts["torn"])


def reconcile_after_resume(config: Any, step: int, log: Callable[[str], None] = print) -> None:
    """Cut the run's episode records and collapse series back to checkpoint ``step`` (see :func:`_keep_record`).
    Resuming a finished run (``step`` at ``max_steps``) also drops the evaluation at ``step``: the final
    evaluation runs again, so it is recorded once."""
    out = Path(config.output_dir)
    name = config.episode_records
    finished = training_finished(step, getattr(config, "max_steps", -1))
    if name:
        path = Path(name) if os.path.isabs(name) else out / name
        if check_regular(path):  # a link is refused: the file it points to is not this run's to rewrite
            dropped, torn = _filter_jsonl(
                path, lambda r: _keep_record(r.get("meta"), step - 1 if finished and _is_eval(r) else step)
            )
            if dropped or torn:
                log(
                    f"llmgym-train: {path.name}: dropped {dropped} record(s) written after step {step}"
                    + (" and a torn last line" if torn else "")
                    + " (they are played again)"
                )
    if config.collapse_report:
        path = out / config.collapse_report
        if check_regular(path):
            dropped, torn = _filter_jsonl(
                path, lambda r: not (isinstance(r.get("step"), int) and r["step"] > step)
            )
            if dropped or torn:
                log(f"llmgym-train: {path.name}: dropped {dropped} row(s) logged after step {step}")


def _is_eval(row: Any) -> bool:
    meta = row.get("meta") if isinstance(row, dict) else None
    return isinstance(meta, dict) and meta.get("mode") == "eval"


def training_finished(step: int, max_steps: Any) -> bool:
    """Whether a run resumed at ``step`` has no training step left (``max_steps`` > 0 reached)."""
    return isinstance(max_steps, int) and max_steps > 0 and step >= max_steps


def load_finished_checkpoint(
    trainer: Any,
    checkpoint: str | os.PathLike,
    log: Callable[[str], None] = print,
    prog: str = "llmgym-train",
) -> None:
    """Resume a run whose checkpoint is at ``max_steps`` without training: the trainer gets the checkpoint's state
    (step, log history) and its weights (and, through our trainer's loader, its signal state), so the final
    evaluation and ``final/`` are the trained model's. ``Trainer.train`` would run one step more first: it checks
    ``max_steps`` only after a step."""
    from llm_gym.trainer import compat
    from transformers import TrainerState

    folder = Path(checkpoint)
    trainer.state = TrainerState.load_from_json(str(folder / "trainer_state.json"))
    compat.load_checkpoint(trainer, str(folder))  # no public equivalent in transformers
    log(
        f"{prog}: {folder.name} is at step {trainer.state.global_step} of max_steps "
        f"{trainer.args.max_steps}: no step left to train; running the final evaluation and saving the model"
    )


def save_final(trainer: Any, config: Any) -> Path:
    """Save the trained model to ``output_dir/final`` whole or not at all: every process saves into
    ``.final.partial/`` (FSDP and DeepSpeed gather across processes), then the main process adds the run file,
    syncs it to disk and renames it over ``final/`` (whatever was there, a link included, is moved aside, never
    followed). A kill leaves the previous ``final/`` (or none) and a ``.final.partial/`` that the next save or
    ``--resume`` removes."""
    out = Path(config.output_dir)
    tmp = out / FINAL_PARTIAL
    main = trainer.accelerator.is_main_process
    if main and (tmp.exists() or tmp.is_symlink()):
        remove_path(tmp)  # a killed save's leftovers
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(tmp))
    trainer.accelerator.wait_for_everyone()
    final = out / FINAL_DIR
    if main:
        write_run_file(tmp, config)  # the chat settings llmgym-eval --model OUTPUT/final reuses
        replace_dir(tmp, final)
    trainer.accelerator.wait_for_everyone()
    return final


# ------------------------------------------------------------------------------------------ the output folder
def resolve_resume(
    output_dir: str | os.PathLike, resume: str, log: Callable[[str], None] = print, prog: str = "llmgym-train"
) -> Path:
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
        remove_path(other)
    note = "".join(f"; skipped {name}: {problem}" for name, problem in skipped)
    log(f"{prog}: resuming from {folder} (step {step}){note}")
    return folder


#: What ``--overwrite_output_dir`` removes: the training output llm-gym writes (other files stay).
def training_outputs(config: Any) -> list[Path]:
    out = Path(config.output_dir)
    # README.md: the model card TRL writes at each save
    names = [
        FINAL_DIR,
        FINAL_PARTIAL,
        "eval_report.json",
        "README.md",
        config.episode_records,
        config.collapse_report,
        config.learning_curve,
        config.episode_gif,
    ]
    if config.collapse_report:
        names.append(str(Path(config.collapse_report).with_suffix(".png")))
    paths = [out / n for n in names if n and not os.path.isabs(n)]
    paths += sorted(out.glob(f".{FINAL_DIR}.old-*"))  # a swap of final/ cut short by a kill
    return [p for p in paths if p.exists() or p.is_symlink()] + [folder for _, folder in checkpoints(out)]


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
        for name in WRITTEN_IN_PLACE:  # before anything changes: a planted README.md -> ~/file is refused
            check_regular(out / name)
        folder = resolve_resume(out, resume, log)
        reconcile_after_resume(config, checkpoint_step(folder), log)
        if (out / FINAL_PARTIAL).exists() or (out / FINAL_PARTIAL).is_symlink():
            remove_path(out / FINAL_PARTIAL)  # the killed run's half-saved final model
        for old in sorted(out.glob(f".{FINAL_DIR}.old-*")):  # a swap of final/ cut short by a kill
            remove_path(old)
        return str(folder)
    ours = (LOCK_FILE, RESUME_CHOICE_FILE, RUN_FILE)  # bookkeeping, not training output
    entries = sorted(p.name for p in out.iterdir() if p.name not in ours) if out.is_dir() else []
    if entries and not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ValueError(
            f"output folder {out} is not empty ({shown}); pass --resume to continue its run or "
            "--overwrite_output_dir to replace its training output"
        )
    if overwrite:
        removed = training_outputs(config)
        for p in removed:
            remove_path(p)  # a link is removed itself, never what it points to
        if removed:
            log(
                f"llmgym-train: --overwrite_output_dir removed {', '.join(p.name for p in removed)} from {out}"
            )
    return None


# ------------------------------------------------------------------------------------------ run settings
#: Config fields saved in :data:`RUN_FILE`: what ``llmgym-eval`` needs to show a trained model the same chat.
RUN_CHAT_FIELDS = tuple(CHAT_SETTINGS)


def write_run_file(folder: str | os.PathLike, config: Any) -> Path:
    """Write :data:`RUN_FILE` into ``folder``: the run's environment and chat settings (JSON)."""
    data = {
        "env": config.env,
        "env_kwargs": config.make_env_kwargs(),
        **{name: getattr(config, name) for name in RUN_CHAT_FIELDS},
    }
    path = Path(folder) / RUN_FILE
    atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n")
    return path


def read_run_chat(model_path: str | os.PathLike) -> tuple[dict[str, Any], Path] | None:
    """The chat settings a trained model was trained with: :data:`RUN_FILE` in ``model_path`` (``final/``, a
    run folder) or in its parent (a ``checkpoint-N`` folder); None when there is none. Only the known fields of
    the expected types are returned (the file is data, not trusted code)."""
    folder = Path(model_path)
    types = {name: type(getattr(ChatFormat(), attr)) for name, attr in CHAT_SETTINGS.items()}
    for candidate in (folder / RUN_FILE, folder.parent / RUN_FILE):
        if not candidate.is_file() or candidate.stat().st_size > 2**20:
            continue
        try:
            data = json.loads(candidate.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"{candidate} is not valid JSON") from None
        if not isinstance(data, dict):
            raise ValueError(f"{candidate} is not a JSON object")
        return {k: data[k] for k, t in types.items() if isinstance(data.get(k), t)}, candidate
    return None


# ------------------------------------------------------------------------------------------ several processes
def publish_resume_choice(
    output_dir: str | os.PathLike, choice: str | None, error: str | None = None
) -> None:
    """Rank 0: write the checkpoint ``--resume`` continues from (or the error that stops the run) for the other
    ranks, which read it with :func:`read_resume_choice` after a barrier; rank 0 alone looks at (and may delete)
    incomplete checkpoints."""
    atomic_write_text(
        Path(output_dir) / RESUME_CHOICE_FILE, json.dumps({"resume": choice, "error": error}) + "\n"
    )


def read_resume_choice(output_dir: str | os.PathLike) -> str | None:
    """Other ranks: rank 0's choice; raises ``ValueError`` with rank 0's error when it refused the run."""
    path = Path(output_dir) / RESUME_CHOICE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read rank 0's resume choice {path}: {e}") from None
    if data.get("error"):
        raise ValueError(str(data["error"]))
    choice = data.get("resume")
    return str(choice) if choice else None
