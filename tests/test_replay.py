"""Replay of episode records: rebuilds the boards, detects records that disagree with the environment."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import llm_gym
from llm_gym.agent.records import read_records, record_episode, write_records
from llm_gym.core import format_response, parse_response
from llm_gym.render.replay import Mismatch, ReplayMismatchError, replay_episode, verify_episode
from llm_gym.render.theme import COLORS


def sokoban_record(seed: int = 5):
    import gymnasium as gym

    env = gym.make("llmgym/Sokoban-v0")
    env.reset(seed=seed)
    plan = llm_gym.envs.sokoban.solve(env.unwrapped.current_level()).plan
    responses = ["no tags here"] + [format_response([m], f"move {m}") for m in plan]
    rec = record_episode(
        "llmgym/Sokoban-v0", responses, seed=seed, env_kwargs={"max_turns": 20}, meta={"policy": "solver"}
    )
    return rec, plan


def test_replay_rebuilds_every_board_after_a_jsonl_round_trip(tmp_path):
    rec, plan = sokoban_record()
    assert rec.success and len(rec.turns) == len(plan) + 1
    path = tmp_path / "ep.jsonl"
    write_records(path, [rec])
    (loaded,) = read_records(path)
    replay = replay_episode(loaded)
    assert replay.ok and replay.mismatch is None
    assert len(replay.frames) == len(loaded.turns) + 1
    assert len({f.shape for f in replay.frames}) == 1
    # The invalid first turn leaves the board unchanged; every push changes it.
    assert np.array_equal(replay.frames[0], replay.frames[1])
    assert not np.array_equal(replay.frames[1], replay.frames[2])
    # The last frame shows the solved board: no plain box left, a box on a goal somewhere.
    last = replay.frames[-1]
    colours = {tuple(int(v) for v in px) for px in last.reshape(-1, 3)}
    assert COLORS["box_on_goal"] in colours and COLORS["box"] not in colours
    assert verify_episode(loaded) is None


def test_tampered_observation_is_reported_with_turn_and_values():
    rec, _ = sokoban_record()
    bad = dataclasses.replace(rec, turns=list(rec.turns))
    bad.turns[2] = dataclasses.replace(rec.turns[2], observation="#####\n#P__#\n#####")
    replay = replay_episode(bad)
    assert not replay.ok
    assert replay.mismatch == Mismatch(3, "observation", "#####\n#P__#\n#####", rec.turns[2].observation)
    assert "turn 3" in str(replay.mismatch) and "observation" in str(replay.mismatch)
    # Frames are still one per state, with one size (recorded text after the mismatch).
    assert len(replay.frames) == len(bad.turns) + 1
    assert len({f.shape for f in replay.frames}) == 1
    with pytest.raises(ReplayMismatchError, match="turn 3"):
        replay_episode(bad, strict=True)


def test_tampered_reward_flags_and_reset_are_reported():
    rec, _ = sokoban_record()
    turns = list(rec.turns)
    turns[1] = dataclasses.replace(turns[1], reward=turns[1].reward + 1.0)
    m = verify_episode(dataclasses.replace(rec, turns=turns))
    assert (m.turn, m.field) == (2, "reward")
    assert m.expected == pytest.approx(rec.turns[1].reward + 1.0) and m.got == pytest.approx(
        rec.turns[1].reward
    )

    turns = list(rec.turns)
    turns[-1] = dataclasses.replace(turns[-1], terminated=False)
    m = verify_episode(dataclasses.replace(rec, turns=turns))
    assert (m.turn, m.field, m.expected, m.got) == (len(turns), "terminated", False, True)

    other_seed = dataclasses.replace(rec, seed=rec.seed + 1)
    m = verify_episode(other_seed)
    assert (m.turn, m.field) == (0, "observation")
    replay = replay_episode(other_seed)
    assert len(replay.frames) == len(rec.turns) + 1


def test_replay_answer_env_and_frozen_lake():
    rec = record_episode("llmgym/Countdown-v0", [format_response(["1+1"], "guess", sep="||")], seed=3)
    replay = replay_episode(rec)
    assert replay.ok and len(replay.frames) == 2
    assert not np.array_equal(replay.frames[0], replay.frames[1])  # the answer and verdict appear

    rec = record_episode(
        "llmgym/FrozenLake-v0",  # slippery: the replay must reproduce the env's own randomness
        [format_response(["Right", "Down"], "r")] * 5,
        seed=11,
    )
    assert verify_episode(rec) is None


def test_unknown_env_id_is_a_clear_error():
    rec, _ = sokoban_record()
    with pytest.raises(ValueError, match="cannot make 'llmgym/Nope-v0'"):
        replay_episode(dataclasses.replace(rec, env_id="llmgym/Nope-v0"))


def test_demo_episode_is_a_solved_replayable_record():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "readme_demo.py"
    spec = importlib.util.spec_from_file_location("readme_demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo_record, reasoning = demo.demo_record, demo.reasoning

    rec = demo_record(seed=5)
    assert rec.success and rec.turns[-1].terminated
    assert all(parse_response(t.response).think for t in rec.turns)
    assert verify_episode(rec) is None
    assert reasoning(["#####", "#@$.#", "#####"], ["Right"]) == (
        "I am at (1, 1), the box is at (1, 2) and the target at (1, 3). Pushing right puts the box on the target. "
        "Moves: Right."
    )
