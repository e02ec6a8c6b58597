"""The episode viewer: its state machine driven by key names and pygame events, drawn without a window."""

from __future__ import annotations

import pygame
import pytest

from llm_gym.core import format_response
from llm_gym.render.replay import record_episode
from llm_gym.render.theme import COLORS
from llm_gym.render.viewer import EpisodeFrames, ViewerState, draw_viewer, load_episode, run_viewer

LONG = " ".join(f"step{i} I think the box should go right because the target is there." for i in range(80))


@pytest.fixture(scope="module")
def records():
    lake = record_episode(
        "llmgym/FrozenLakeDeterministic-v0",
        [
            format_response(["Right"], LONG),
            format_response(["Down"], "short"),
            format_response(["Right"], "end"),
        ],
        seed=1,
        reset_options={"map": ["SFFF", "FFFF", "FFHF", "FFFG"]},
    )
    quiz = record_episode("llmgym/Countdown-v0", [format_response(["1+2"], "try")], seed=2)
    return [lake, quiz]


def test_keys_step_play_and_switch_episodes(records):
    state = ViewerState(records, fps=2.0)
    assert (state.episode, state.turn, state.playing) == (0, 0, False)
    state.handle_key("left")
    assert state.turn == 0  # clamped at the start
    state.handle_key("right")
    state.handle_key("right")
    assert state.turn == 2
    state.handle_key("end")
    assert state.turn == 3
    state.handle_key("right")
    assert state.turn == 3  # clamped at the end
    state.handle_key("space")  # at the end: play again from the start
    assert state.playing and state.turn == 0
    state.tick(0.49)
    assert state.turn == 0
    state.tick(0.02)
    assert state.turn == 1
    state.tick(5.0)
    assert state.turn == 3 and not state.playing  # pauses at the last turn
    state.handle_key("home")
    state.handle_key("space")
    state.tick(0.5)
    state.handle_key("space")  # pause
    state.tick(5.0)
    assert state.turn == 1 and not state.playing
    state.handle_key("down")
    assert (state.episode, state.turn) == (1, 0)
    state.handle_key("n")
    assert state.episode == 1  # no episode after the last
    state.handle_key("p")
    assert state.episode == 0
    state.handle_key("up")
    assert state.episode == 0
    version = state.version
    state.handle_key("f12")  # unknown keys change nothing
    assert state.version == version and state.running
    state.handle_key("q")
    assert not state.running


def test_long_reasoning_wraps_and_scrolls(records):
    state = ViewerState(records)  # state 0: the first board with turn 1's (long) reasoning
    before = draw_viewer(state)
    assert before.get_size() == (1100, 640)
    assert state.max_scroll > 0, "80 sentences do not fit: the caption must scroll"
    state.handle_key("pagedown")
    assert state.scroll == 10
    after = draw_viewer(state)
    assert pygame.image.tobytes(before, "RGB") != pygame.image.tobytes(after, "RGB")
    state.handle_event(pygame.event.Event(pygame.MOUSEWHEEL, x=0, y=-1, flipped=False))
    assert state.scroll == 13  # wheel down: three more lines
    state.handle_event(pygame.event.Event(pygame.KEYDOWN, key=pygame.K_PAGEUP, mod=0, unicode="", scancode=0))
    assert state.scroll == 3
    state.scroll_by(10_000)
    assert state.scroll == state.max_scroll
    state.handle_key("pageup")
    assert state.scroll == state.max_scroll - 10
    state.handle_key("right")  # a new turn starts at the top
    assert state.scroll == 0


def test_draw_shows_the_board_and_mismatch_banner(records):
    state = ViewerState(records)
    surf = draw_viewer(state)
    colours = {tuple(surf.get_at((x, y)))[:3] for x in range(0, 500, 4) for y in range(40, 600, 4)}
    assert COLORS["player"] in colours and COLORS["hole"] in colours
    bad = ViewerState(
        records, loader=lambda rec: EpisodeFrames(load_episode(rec).frames, "replay mismatch at turn 2")
    )
    surf = draw_viewer(bad)
    assert tuple(surf.get_at((5, 35)))[:3] == COLORS["highlight"]


def test_unreplayable_record_falls_back_to_recorded_text(records):
    import dataclasses

    broken = dataclasses.replace(records[0], env_id="llmgym/Gone-v0")
    data = load_episode(broken)
    assert data.problem and "Gone-v0" in data.problem
    assert len(data.frames) == len(broken.turns) + 1
    draw_viewer(ViewerState([broken]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="no episodes"):
        ViewerState([])


def test_window_loop_with_posted_events(records):
    pygame.display.init()
    for key in (pygame.K_RIGHT, pygame.K_RIGHT, pygame.K_DOWN, pygame.K_q):
        pygame.event.post(pygame.event.Event(pygame.KEYDOWN, key=key, mod=0, unicode="", scancode=0))
    state = run_viewer(records, max_frames=50)
    assert not state.running
    assert (state.episode, state.turn) == (1, 0)
    assert not pygame.display.get_init()
