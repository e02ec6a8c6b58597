"""Export a recorded episode as a GIF or MP4: each frame is the board beside a caption panel (headless)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llm_gym.agent.records import EpisodeRecord
from llm_gym.core.checks import is_int
from llm_gym.render.board import check_cell
from llm_gym.render.panel import compose, draw_caption, turn_view
from llm_gym.render.replay import Mismatch, Replay, iter_replay, replay_episode
from llm_gym.render.theme import COLORS

VIDEO_SUFFIXES = (".gif", ".mp4")


#: Bounds on what one export may ask for (pixels, states, frame rate, hold).
CAPTION_WIDTH_LIMITS = (120, 2000)
MAX_FRAMES_LIMIT = 100_000
FPS_LIMITS = (0.01, 120.0)
HOLD_LIMIT = 1000


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_episode` wrote; ``cut`` when the episode had more states than ``max_frames``."""

    path: Path
    n_frames: int
    size: tuple[int, int]
    mismatch: Mismatch | None
    cut: bool = False


def _caption_frame(
    record: EpisodeRecord, t: int, board: np.ndarray, caption_width: int, min_height: int, font_size: int
):
    from llm_gym.render.scene import from_array, to_array

    height = max(board.shape[0], min_height)
    caption, _ = draw_caption(turn_view(record, t), (caption_width, height), font_size=font_size)
    return to_array(compose(from_array(board), caption))


def iter_episode_frames(
    record: EpisodeRecord,
    *,
    cell: int | None = None,
    caption_width: int = 300,
    min_height: int = 240,
    font_size: int = 16,
    env_kwargs: dict | None = None,
    max_frames: int | None = None,
    replay: Replay | None = None,
) -> Iterator[np.ndarray]:
    """:func:`episode_frames` one frame at a time (at most ``max_frames``); the replay's outcome goes into
    ``replay`` (a :class:`Replay` to fill) when given."""
    replay = replay if replay is not None else Replay(record)
    frames = iter_replay(record, cell=cell, env_kwargs=env_kwargs, result=replay)
    try:
        for t, board in enumerate(frames):
            if max_frames is not None and t >= max_frames:
                break
            yield _caption_frame(record, t, board, caption_width, min_height, font_size)
    finally:
        frames.close()


def episode_frames(
    record: EpisodeRecord,
    *,
    cell: int | None = None,
    caption_width: int = 300,
    min_height: int = 240,
    font_size: int = 16,
    replay: Replay | None = None,
) -> tuple[list[np.ndarray], Replay]:
    """One ``HxWx3`` frame per state (reset + each turn): the board beside its caption. All frames share a size."""
    replay = replay if replay is not None else replay_episode(record, cell=cell)
    frames = [
        _caption_frame(record, t, board, caption_width, min_height, font_size)
        for t, board in enumerate(replay.frames)
    ]
    return frames, replay


def _pad_to_multiple(frame: np.ndarray, k: int) -> np.ndarray:
    h, w = frame.shape[:2]
    ph, pw = -h % k, -w % k
    if not ph and not pw:
        return frame
    out = np.empty((h + ph, w + pw, 3), dtype=np.uint8)
    out[...] = COLORS["background"]
    out[:h, :w] = frame
    return out


def write_video(
    frames: Iterable[np.ndarray], path: str | Path, fps: float = 2.0, *, hold_last: int = 0
) -> int:
    """Write ``frames`` to ``path``; the suffix picks the format (``.gif`` via pillow, ``.mp4`` via ffmpeg).

    Frames are consumed one at a time: an MP4 is encoded as they come, a GIF keeps only each frame's 256-colour
    palette image (a third of the RGB size) until it is saved. ``hold_last`` shows the last frame that many
    frame-times longer (so a looping GIF pauses on the result). Returns the number of frames in the file (a GIF
    holds by duration, an MP4 by repeating the frame)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise ValueError(f"output must end in {' or '.join(VIDEO_SUFFIXES)}, got {path.name!r}")
    if not (isinstance(fps, (int, float)) and FPS_LIMITS[0] <= fps <= FPS_LIMITS[1]):
        raise ValueError(f"fps must be in [{FPS_LIMITS[0]}, {FPS_LIMITS[1]}], got {fps}")
    hold_last = int(hold_last)
    if not 0 <= hold_last <= HOLD_LIMIT:
        raise ValueError(f"hold_last must be in [0, {HOLD_LIMIT}], got {hold_last}")
    try:
        import imageio.v2 as iio2
    except ImportError as e:
        from gymnasium.error import DependencyNotInstalled

        raise DependencyNotInstalled('imageio is not installed; run `pip install "llm-gym[render]"`') from e
    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        raise ValueError("no frames to write")
    shape = first.shape

    def checked() -> Iterator[np.ndarray]:
        yield first
        for frame in frames:
            if frame.shape != shape:
                raise ValueError(f"all frames must have one size, got {shape} and {frame.shape}")
            yield frame

    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".gif":
        return _write_gif(checked(), path, fps, hold_last)
    n = 0
    last = first
    # H.264 with yuv420p needs even sides; padding to 16 also avoids imageio's resize.
    writer: Any  # imageio's FFMPEG writer (its stubs lack append_data)
    with iio2.get_writer(
        path, format="FFMPEG", fps=fps, codec="libx264", pixelformat="yuv420p", macro_block_size=16
    ) as writer:
        for frame in checked():
            writer.append_data(_pad_to_multiple(frame, 16))
            last, n = frame, n + 1
        for _ in range(hold_last):
            writer.append_data(_pad_to_multiple(last, 16))
    return n + hold_last


def _write_gif(frames: Iterator[np.ndarray], path: Path, fps: float, hold_last: int) -> int:
    from PIL import Image

    # Pillow merges identical consecutive frames, so the hold is a longer duration, not repeated frames.
    images = [Image.fromarray(f).quantize(colors=256, method=Image.Quantize.MEDIANCUT) for f in frames]
    durations = [1000.0 / fps] * len(images)
    durations[-1] *= 1 + hold_last
    images[0].save(path, save_all=True, append_images=images[1:], duration=durations, loop=0)
    return len(images)


def export_episode(
    record: EpisodeRecord,
    out: str | Path,
    *,
    fps: float = 2.0,
    cell: int | None = None,
    caption_width: int = 300,
    hold_last: int = 0,
    env_kwargs: dict | None = None,
    max_frames: int = 1000,
) -> ExportResult:
    """Replay ``record`` and write it to ``out`` (``.gif`` or ``.mp4``), streaming frames to the writer; the last
    frame is held ``hold_last`` extra frame-times so the end is readable when the GIF loops.

    ``env_kwargs`` are the user's (trusted) kwargs overriding the record's; at most ``max_frames`` states are drawn.
    """
    if cell is not None:
        check_cell(cell)
    lo, hi = CAPTION_WIDTH_LIMITS
    if not is_int(caption_width, numpy=False) or not lo <= caption_width <= hi:
        raise ValueError(f"caption width must be an integer in [{lo}, {hi}] pixels, got {caption_width!r}")
    if not is_int(max_frames, numpy=False) or not 1 <= max_frames <= MAX_FRAMES_LIMIT:
        raise ValueError(f"max_frames must be an integer in [1, {MAX_FRAMES_LIMIT}], got {max_frames!r}")
    replay = Replay(record)
    size: list[tuple[int, int]] = []

    def frames() -> Iterator[np.ndarray]:
        for frame in iter_episode_frames(
            record,
            cell=cell,
            caption_width=caption_width,
            env_kwargs=env_kwargs,
            max_frames=max_frames,
            replay=replay,
        ):
            if not size:
                size.append((frame.shape[1], frame.shape[0]))
            yield frame

    n = write_video(frames(), out, fps, hold_last=hold_last)
    cut = len(record.turns) + 1 > max_frames
    return ExportResult(Path(out), n, size[0], replay.mismatch, cut)
