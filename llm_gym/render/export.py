"""Export a recorded episode as a GIF or MP4: each frame is the board beside a caption panel (headless)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm_gym.agent.records import EpisodeRecord
from llm_gym.render.panel import compose, draw_caption, turn_view
from llm_gym.render.replay import Mismatch, Replay, replay_episode
from llm_gym.render.theme import COLORS

VIDEO_SUFFIXES = (".gif", ".mp4")


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_episode` wrote."""

    path: Path
    n_frames: int
    size: tuple[int, int]
    mismatch: Mismatch | None


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
    from llm_gym.render.scene import from_array, to_array

    replay = replay if replay is not None else replay_episode(record, cell=cell)
    frames = []
    for t, board in enumerate(replay.frames):
        board_surf = from_array(board)
        height = max(board.shape[0], min_height)
        caption, _ = draw_caption(turn_view(record, t), (caption_width, height), font_size=font_size)
        frames.append(to_array(compose(board_surf, caption)))
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
    frames: Sequence[np.ndarray], path: str | Path, fps: float = 2.0, *, hold_last: int = 0
) -> int:
    """Write ``frames`` to ``path``; the suffix picks the format (``.gif`` via pillow, ``.mp4`` via ffmpeg).

    ``hold_last`` shows the last frame that many frame-times longer (so a looping GIF pauses on the result).
    Returns the number of frames in the file (a GIF holds by duration, an MP4 by repeating the frame)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
        raise ValueError(f"output must end in {' or '.join(VIDEO_SUFFIXES)}, got {path.name!r}")
    if not frames:
        raise ValueError("no frames to write")
    if not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    shapes = {f.shape for f in frames}
    if len(shapes) != 1:
        raise ValueError(f"all frames must have one size, got {sorted(shapes)}")
    try:
        import imageio.v2 as iio2
        import imageio.v3 as iio
    except ImportError as e:
        from gymnasium.error import DependencyNotInstalled

        raise DependencyNotInstalled('imageio is not installed; run `pip install "llm-gym[render]"`') from e
    path.parent.mkdir(parents=True, exist_ok=True)
    hold_last = max(0, int(hold_last))
    if suffix == ".gif":
        # Pillow merges identical consecutive frames, so the hold is a longer duration, not repeated frames.
        durations = [1000.0 / fps] * len(frames)
        durations[-1] *= 1 + hold_last
        iio.imwrite(path, np.stack(frames), extension=".gif", duration=durations, loop=0)
        return len(frames)
    frames = list(frames) + [frames[-1]] * hold_last
    # H.264 with yuv420p needs even sides; padding to 16 also avoids imageio's resize.
    with iio2.get_writer(
        path, format="FFMPEG", fps=fps, codec="libx264", pixelformat="yuv420p", macro_block_size=16
    ) as writer:
        for frame in frames:
            writer.append_data(_pad_to_multiple(frame, 16))
    return len(frames)


def export_episode(
    record: EpisodeRecord,
    out: str | Path,
    *,
    fps: float = 2.0,
    cell: int | None = None,
    caption_width: int = 300,
    hold_last: int = 0,
) -> ExportResult:
    """Replay ``record`` and write it to ``out`` (``.gif`` or ``.mp4``); the last frame is held ``hold_last``
    extra frame-times so the end is readable when the GIF loops."""
    frames, replay = episode_frames(record, cell=cell, caption_width=caption_width)
    n = write_video(frames, out, fps, hold_last=hold_last)
    h, w = frames[0].shape[:2]
    return ExportResult(Path(out), n, (w, h), replay.mismatch)
