"""``llmgym render`` on hostile records: bounded image size, frame count and text (issue 16, item 9)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pygame")
pytest.importorskip("imageio")

from llm_gym.agent.records import (
    record_episode,  # noqa: E402
    write_records,  # noqa: E402
)
from llm_gym.cli import main  # noqa: E402
from llm_gym.render.export import export_episode, write_video  # noqa: E402
from llm_gym.render.panel import REASONING_MAX_CHARS, draw_caption, turn_view  # noqa: E402

LAKE = "llmgym/FrozenLakeDeterministic-v0"


def _long_record(turns: int):
    kwargs = {"max_turns": turns + 1, "max_actions": 10**6}
    return record_episode(LAKE, ["no tags"] * turns, seed=0, env_kwargs=kwargs)


def test_huge_cell_is_a_clear_error_not_a_crash(tmp_path, capsys):
    path = tmp_path / "ep.jsonl"
    write_records(path, [record_episode(LAKE, ["<think>.</think><answer>Left</answer>"], seed=0)])
    out = str(tmp_path / "a.gif")
    # an error exit (1 runtime or 2 usage), with the reason
    assert main(["render", str(path), "--out", out, "--cell", "5000"]) in (1, 2)
    assert "cell size must be" in capsys.readouterr().err
    assert main(["render", str(path), "--out", out, "--caption-width", "100000"]) in (1, 2)
    assert "caption width" in capsys.readouterr().err


def test_frame_count_is_bounded_and_frames_stream(tmp_path):
    record = _long_record(3000)
    start = time.perf_counter()
    result = export_episode(record, tmp_path / "long.mp4", max_frames=5)
    assert time.perf_counter() - start < 20
    assert result.cut and result.n_frames == 5


def test_write_video_takes_a_one_shot_iterator(tmp_path):
    import numpy as np

    made = []

    def frames():
        for i in range(3):
            made.append(i)
            yield np.full((16, 16, 3), 40 * i, dtype=np.uint8)

    assert write_video(frames(), tmp_path / "x.mp4", fps=2, hold_last=1) == 4
    assert made == [0, 1, 2]
    with pytest.raises(ValueError, match="fps must be in"):
        write_video(frames(), tmp_path / "y.gif", fps=0)


def test_huge_reasoning_costs_bounded_time():
    record = record_episode(
        LAKE, ["<think>" + "word " * 10_000_000 + "</think><answer>Left</answer>"], seed=0
    )
    start = time.perf_counter()
    view = turn_view(record, 0)
    assert len(view.reasoning) < REASONING_MAX_CHARS + 100 and "more characters not shown" in view.reasoning
    draw_caption(view, (300, 240))
    assert time.perf_counter() - start < 5
