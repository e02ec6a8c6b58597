"""``llmgym play``: keys become env actions wrapped in the response format; typed answers for answer envs."""

from __future__ import annotations

import json

import pygame
import pytest

from llm_gym.cli import main
from llm_gym.core import parse_response
from llm_gym.render.play import HUMAN_THINK, PlaySession, draw_play, run_play
from llm_gym.render.replay import verify_episode


def test_arrow_keys_move_the_sokoban_player():
    session = PlaySession("llmgym/Sokoban-v0", seed=3)
    assert set(session.arrow_actions) == {"up", "down", "left", "right"}
    base = session.unwrapped
    start = base.player
    for key in ("up", "down", "left", "right"):
        session.handle_key(key)
    rec = session.record
    assert len(rec.turns) == 4
    for turn, action in zip(rec.turns, ("Up", "Down", "Left", "Right")):
        parsed = parse_response(turn.response)
        assert parsed.ok and parsed.think == HUMAN_THINK and parsed.actions == (action,)
        assert turn.info["action_is_valid"]
    assert base.player != start or any(t.info["action_is_effective"] for t in rec.turns)
    # What was played is a valid, replayable record.
    assert verify_episode(rec) is None
    assert draw_play(session).get_size() == (1000, 600)


def test_play_without_a_seed_records_a_concrete_replayable_seed():
    session = PlaySession("llmgym/Sokoban-v0")
    for key in ("up", "left", "down", "right"):
        session.handle_key(key)
    first = session.record
    assert isinstance(first.seed, int) and 0 <= first.seed < 2**32
    assert verify_episode(first) is None
    session.new_episode()
    assert session.record.seed == first.seed + 1


def test_typed_answer_for_an_answer_env_and_new_episode_on_enter():
    session = PlaySession("llmgym/Countdown-v0", seed=5)
    assert session.arrow_actions == {}
    for ch in "1+2":
        session.handle_key(ch, ch)
    session.handle_key("x", "x")
    session.handle_key("backspace")
    assert session.buffer == "1+2"
    session.handle_key("up")  # no direction actions here: ignored
    assert not session.record.turns
    session.handle_key("return")
    assert session.buffer == ""
    card = session.unwrapped.card()
    assert card["answer"] == "1+2" and card["verdict"]
    assert session.done  # single-answer env
    draw_play(session)
    session.handle_key("return")  # Enter after the end: a new episode with the next seed
    assert len(session.records) == 2 and session.record.seed == 6 and not session.record.turns


def test_typed_invalid_action_costs_the_format_penalty():
    session = PlaySession("llmgym/FrozenLakeDeterministic-v0", seed=0)
    for ch in "Jump":
        session.handle_key(ch.lower(), ch)
    session.handle_key("return")
    turn = session.record.turns[-1]
    assert not turn.info["action_is_valid"] and turn.reward == pytest.approx(-0.1)
    assert session.message.startswith("invalid")
    for ch in "Right || Down":
        session.handle_key(ch.lower(), ch)
    session.handle_key("return")
    assert session.record.turns[-1].actions == ["Right", "Down"]
    session.handle_key("escape")
    assert not session.running


def test_unknown_env_is_a_value_error():
    with pytest.raises(ValueError, match="cannot make"):
        PlaySession("llmgym/Nope-v0")


def test_cli_play_in_a_headless_window(tmp_path):
    pygame.display.init()
    for key, text in ((pygame.K_RIGHT, ""), (pygame.K_DOWN, ""), (pygame.K_ESCAPE, "")):
        pygame.event.post(pygame.event.Event(pygame.KEYDOWN, key=key, mod=0, unicode=text, scancode=0))
    out = tmp_path / "human.jsonl"
    assert main(["play", "--env", "FrozenLakeDeterministic", "--seed", "0", "--record", str(out)]) == 0
    (line,) = out.read_text().splitlines()
    rec = json.loads(line)
    assert rec["env_id"] == "llmgym/FrozenLakeDeterministic-v0" and rec["seed"] == 0
    assert [t["actions"] for t in rec["turns"]] == [["Right"], ["Down"]]
    assert not pygame.display.get_init()


def test_run_play_stops_after_max_frames():
    session = run_play("llmgym/Bandit-v0", seed=0, max_frames=3)
    assert session.running and not session.record.turns
