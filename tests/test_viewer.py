"""The episode viewer: its state machine driven by key names and pygame events, drawn without a window."""

from __future__ import annotations

import numpy as np
import pygame
import pytest

from llm_gym.agent.records import record_episode
from llm_gym.core import format_response
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


def test_lazy_frames_equal_the_full_replay_in_any_order():
    from llm_gym.render.replay import replay_episode

    responses = [format_response([a], "x") for a in ("Right", "Down", "Left", "Right", "Down")]
    rec = record_episode(
        "llmgym/FrozenLakeDeterministic-v0",
        responses,
        seed=3,
        reset_options={"map": ["SFFF", "FFFF", "FFFF", "FFFG"]},
    )
    full = replay_episode(rec).frames
    data = load_episode(rec)
    assert data.problem is None and len(data.frames) == len(full) == len(rec.turns) + 1
    for t in (4, 1, 5, 0, 3, 2, -1):  # backward jumps restart the replay from the reset
        assert (data.frames[t] == full[t]).all(), t
    # A tampered observation: the env's boards up to it, then the recorded text, as in the full replay.
    import dataclasses

    turns = list(rec.turns)
    turns[2] = dataclasses.replace(turns[2], observation="tampered")
    bad = dataclasses.replace(rec, turns=turns)
    full = replay_episode(bad)
    data = load_episode(bad)
    assert data.problem and "turn 3" in data.problem and str(full.mismatch) in data.problem
    for t in (5, 0, 3, 2, 4):
        assert (data.frames[t] == full.frames[t]).all(), t
    data.close()


def test_a_10k_turn_record_opens_fast_in_bounded_memory():
    """Issue 16 item 9: the viewer drew every state when an episode was opened (10,001 boards, ~4.4 GB)."""
    import time
    import tracemalloc

    from llm_gym.render.viewer import FRAME_CACHE_SIZE

    n = 10_000
    moves = [format_response(["Right" if i % 2 == 0 else "Left"], "r") for i in range(n)]
    rec = record_episode(
        "llmgym/FrozenLakeDeterministic-v0",
        moves,
        seed=0,
        env_kwargs={"max_turns": n, "max_actions": n},
        reset_options={"map": ["SFFF", "FFFF", "FFFF", "FFFG"]},
    )
    assert len(rec.turns) == n
    state = ViewerState([rec, rec])
    t0 = time.perf_counter()
    draw_viewer(state)  # opens the episode: checks the record (a replay without drawing), draws state 0
    state.handle_key("end")
    draw_viewer(state)
    opened = time.perf_counter() - t0
    # Drawing all states took ~11 s and 4.4 GB; checking and drawing two takes ~0.4 s here.
    assert opened < 4.0, f"opening and jumping to the end took {opened:.2f} s"
    frames = state.episode_frames().frames
    assert len(frames) == n + 1
    drawn = frames.drawn
    for _ in range(FRAME_CACHE_SIZE):  # stepping back: one restart caches half a cache of earlier states
        state.handle_key("left")
        draw_viewer(state)
    assert frames.drawn - drawn == FRAME_CACHE_SIZE and state.turn == n - FRAME_CACHE_SIZE
    tracemalloc.start()
    state.handle_key("down")  # the second episode, opened with memory traced
    draw_viewer(state)
    state.handle_key("end")
    draw_viewer(state)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert state.episode_frames().frames.cached <= FRAME_CACHE_SIZE
    # One board is 0.44 MB; all 10,001 were 4.4 GB.
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    state.close()


def test_open_episodes_are_bounded_and_closed():
    from llm_gym.render.viewer import EPISODE_CACHE_SIZE, CachedFrames

    closed = []

    def loader(rec):
        frames = CachedFrames(3, lambda i: np.zeros((4, 4, 3), np.uint8), close=lambda: closed.append(1))
        return EpisodeFrames(frames)

    state = ViewerState([object()] * (EPISODE_CACHE_SIZE + 3), loader=loader)
    opened = [state.episode_frames()]
    for _ in range(EPISODE_CACHE_SIZE + 2):
        state.handle_key("down")
        opened.append(state.episode_frames())
    assert len(closed) == 3  # the three least recently shown episodes
    state.handle_key("up")
    assert state.episode_frames() is opened[-2]  # still open: not reloaded
    state.close()
    assert len(closed) == len(opened)


def test_cached_frames_keep_at_most_cache_size():
    from llm_gym.render.viewer import CachedFrames

    calls = []
    frames = CachedFrames(100, lambda i: calls.append(i) or np.full((2, 2, 3), i, np.uint8), cache_size=4)
    assert [int(frames[i][0, 0, 0]) for i in (0, 1, 2, 3, 0, 4, 1, -1)] == [0, 1, 2, 3, 0, 4, 1, 99]
    assert calls == [0, 1, 2, 3, 4, 1, 99]  # 0 was a hit; 1 had been evicted by 4
    assert frames.cached == 4
    with pytest.raises(IndexError):
        frames[100]
