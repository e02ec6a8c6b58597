"""GIF/MP4 export and the ``llmgym render`` command: files read back with the right frame count."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest

from llm_gym.agent.records import record_episode, write_records
from llm_gym.cli import main, resolve_env_id
from llm_gym.core import format_response
from llm_gym.render.export import episode_frames, export_episode, write_video


@pytest.fixture(scope="module")
def lake_record():
    responses = [
        format_response(["Right", "Down"], "The goal is down and to the right. " * 30),
        "I forgot the format",
        format_response(["Down"], "short"),
    ]
    options = {"map": ["SFFF", "FFFF", "FFHF", "FFFG"]}
    rec = record_episode("llmgym/FrozenLakeDeterministic-v0", responses, seed=4, reset_options=options)
    assert len(rec.turns) == 3 and not rec.turns[-1].terminated
    return rec


def test_gif_and_mp4_read_back_with_one_frame_per_state(tmp_path, lake_record):
    n_states = len(lake_record.turns) + 1
    gif = export_episode(lake_record, tmp_path / "ep.gif", fps=4)
    frames = iio.imread(gif.path)
    assert gif.n_frames == n_states and frames.shape[0] == n_states
    assert frames.shape[1:3] == (gif.size[1], gif.size[0])
    mp4 = export_episode(lake_record, tmp_path / "ep.mp4", fps=4, hold_last=2)
    video = iio.imread(mp4.path)
    assert mp4.n_frames == n_states + 2 and video.shape[0] == n_states + 2
    assert video.shape[1] % 16 == 0 and video.shape[2] % 16 == 0


def test_frames_have_one_size_and_show_the_board_left(lake_record):
    frames, replay = episode_frames(lake_record, caption_width=260)
    assert replay.ok
    assert len({f.shape for f in frames}) == 1
    board_w = replay.frames[0].shape[1]
    assert frames[0].shape[1] == board_w + 260
    assert np.array_equal(frames[1][: replay.frames[1].shape[0], :board_w], replay.frames[1])
    # Captions differ from turn to turn.
    assert not np.array_equal(frames[1][:, board_w:], frames[2][:, board_w:])


def test_write_video_rejects_bad_input(tmp_path):
    frame = np.zeros((16, 16, 3), np.uint8)
    with pytest.raises(ValueError, match=".gif or .mp4"):
        write_video([frame], tmp_path / "x.avi")
    with pytest.raises(ValueError, match="no frames"):
        write_video([], tmp_path / "x.gif")
    with pytest.raises(ValueError, match="one size"):
        write_video([frame, np.zeros((8, 8, 3), np.uint8)], tmp_path / "x.gif")


def test_cli_render(tmp_path, lake_record, capsys):
    path = tmp_path / "eps.jsonl"
    write_records(path, [lake_record, lake_record], append=False)
    out = tmp_path / "out.gif"
    assert main(["render", str(path), "--out", str(out), "--episode", "-1", "--fps", "3", "--hold", "0"]) == 0
    assert "episode 1" in capsys.readouterr().out
    assert iio.imread(out).shape[0] == len(lake_record.turns) + 1
    assert main(["render", str(path), "--out", str(out), "--episode", "5"]) == 1
    assert "out of range" in capsys.readouterr().err
    assert main(["render", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 1


def test_resolve_env_id():
    assert resolve_env_id("Sokoban") == "llmgym/Sokoban-v0"
    assert resolve_env_id("frozenlake") == "llmgym/FrozenLake-v0"
    assert resolve_env_id("Countdown-v0") == "llmgym/Countdown-v0"
    assert resolve_env_id("llmgym/Bandit-v0") == "llmgym/Bandit-v0"
    with pytest.raises(ValueError, match=r"llm_gym\.list_envs\(\)"):
        resolve_env_id("Chess")


def test_turn_view_pairs_each_board_with_the_turn_played_from_it(lake_record):
    from llm_gym.render.panel import turn_view

    first = turn_view(lake_record, 0)
    assert first.reasoning.startswith("The goal is down") and first.actions == ("Right", "Down")
    invalid = turn_view(lake_record, 1)
    assert (
        invalid.reasoning == "I forgot the format" and invalid.error and invalid.reward == pytest.approx(-0.1)
    )
    end = turn_view(lake_record, 3)
    assert (
        end.final
        and end.status == "unfinished"
        and end.total_reward == pytest.approx(lake_record.total_reward)
    )
    with pytest.raises(ValueError, match="state must be in"):
        turn_view(lake_record, 4)


def test_cli_view_rejects_a_bad_episode_index_before_opening_a_window(tmp_path, lake_record, capsys):
    path = tmp_path / "eps.jsonl"
    write_records(path, [lake_record], append=False)
    assert main(["view", str(path), "--episode", "3"]) == 1
    assert "out of range" in capsys.readouterr().err
