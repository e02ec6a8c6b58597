"""Board and card rendering: pixels where the state says, stable frame sizes, no display in rgb_array mode."""

from __future__ import annotations

import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llm_gym
from llm_gym.core import format_response
from llm_gym.render import render_frame, require_pygame
from llm_gym.render.board import draw_board, layout_from_lake, layout_from_xsb
from llm_gym.render.card import draw_card, verdict_color
from llm_gym.render.scene import draw_env, env_kind, from_array, to_array
from llm_gym.render.text import font, wrap_text
from llm_gym.render.theme import CARD_SIZE, COLORS

XSB_COLOR = {
    "#": "wall",
    " ": "floor",
    ".": "goal",
    "$": "box",
    "*": "box_on_goal",
    "@": "player",
    "+": "player",
}
LAKE_COLOR = {"S": "start", "F": "ice", "H": "hole", "G": "lake_goal"}
# MetaMathQA ids load from the Hub by default; tests use the bundled sample instead.
OFFLINE_KWARGS = {
    i: {"dataset": "sample"} for i in llm_gym.list_envs() if "MetaMathQA" in i and "Sample" not in i
}


def centre(frame: np.ndarray, r: int, c: int, cell: int) -> tuple[int, int, int]:
    return tuple(int(v) for v in frame[r * cell + cell // 2, c * cell + cell // 2])


def assert_xsb_pixels(frame: np.ndarray, rows: list[str]) -> None:
    cell = frame.shape[0] // len(rows)
    assert frame.shape[:2] == (cell * len(rows), cell * max(len(r) for r in rows))
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            assert centre(frame, r, c, cell) == COLORS[XSB_COLOR[ch]], (r, c, ch)


def test_sokoban_pixels_follow_board_through_an_episode():
    env = gym.make("llmgym/Sokoban-v0", render_mode="rgb_array")
    env.reset(seed=7)
    base = env.unwrapped
    plan = llm_gym.envs.sokoban.solve(base.current_level()).plan
    assert plan, "generated levels are solvable"
    frame = env.render()
    shape = frame.shape
    assert_xsb_pixels(frame, base.board())
    for move in plan:
        before = base.board()
        env.step(format_response([move], "push"))
        frame = env.render()
        assert frame.shape == shape, "frame size is stable within an episode"
        assert frame.dtype == np.uint8
        assert base.board() != before
        assert_xsb_pixels(frame, base.board())
    # Solved: every box is drawn as a box on a goal.
    assert all("$" not in row for row in base.board())
    assert any("*" in row for row in base.board())


def test_sokoban_large_two_boxes():
    env = gym.make("llmgym/SokobanLarge-v0", render_mode="rgb_array")
    env.reset(seed=3)
    rows = env.unwrapped.board()
    assert sum(row.count("$") + row.count("*") for row in rows) == 2
    assert_xsb_pixels(env.render(), rows)


def test_frozen_lake_pixels_and_player_in_hole():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", render_mode="rgb_array")
    env.reset(seed=0, options={"map": ["SFFF", "FHFH", "FFFH", "HFFG"]})
    frame = env.render()
    cell = frame.shape[0] // 4
    base = env.unwrapped
    for r, row in enumerate(base.desc):
        for c, ch in enumerate(row):
            want = "player" if (r, c) == base.player else LAKE_COLOR[ch]
            assert centre(frame, r, c, cell) == COLORS[want]
    env.step(format_response(["Right"], "go"))
    env.step(format_response(["Down"], "oops"))  # (1, 1) is a hole
    frame2 = env.render()
    assert frame2.shape == frame.shape
    assert base.player == (1, 1)
    assert centre(frame2, 1, 1, cell) == COLORS["fallen"]
    assert centre(frame2, 0, 0, cell) == COLORS["start"]


def test_board_layout_from_xsb_pads_short_rows_and_rejects_unknown_glyphs():
    layout = layout_from_xsb(["####", "#@", "####"])
    assert layout.shape == (3, 4)
    assert layout.bases[1][2] == "floor"
    assert layout.pieces == ((1, 1, "player"),)
    with pytest.raises(ValueError, match="unknown XSB character"):
        layout_from_xsb(["#X#"])
    with pytest.raises(ValueError):
        layout_from_xsb([])
    with pytest.raises(ValueError, match="outside"):
        layout_from_lake(["SF", "FG"], (2, 0))


@pytest.mark.parametrize("cell", [8, 17, 64])
def test_board_cell_sizes(cell):
    rows = ["#####", "#@$.#", "#  *#", "#####"]
    frame = to_array(draw_board(layout_from_xsb(rows), cell))
    assert frame.shape == (4 * cell, 5 * cell, 3)
    assert_xsb_pixels(frame, rows)


class FakeSokoban:
    def __init__(self, rows):
        self.rows = rows

    def board(self):
        return self.rows


class FakeQuiz:
    def __init__(self, **card):
        self._card = card

    def card(self):
        return self._card


class FakeText:
    def _observation(self):
        return "a plain text state\nwith two lines"


def test_duck_typed_dispatch():
    assert env_kind(FakeSokoban(["#@#"])) == "board"
    assert env_kind(FakeQuiz()) == "card"
    assert env_kind(gym.make("llmgym/FrozenLake-v0")) == "lake"
    assert env_kind(FakeText()) == "text"
    assert_xsb_pixels(
        to_array(draw_env(FakeSokoban(["#####", "#@$.#", "#####"]))), ["#####", "#@$.#", "#####"]
    )
    text = to_array(draw_env(FakeText()))
    assert text.shape == (CARD_SIZE[1], CARD_SIZE[0], 3)
    # Some dark text pixels were drawn on the light card below the title bar.
    assert (text[40:, :, :].sum(axis=2) < 200).any()


def _pill_color(frame: np.ndarray) -> tuple[int, int, int]:
    h, w = frame.shape[:2]
    return tuple(int(v) for v in frame[h - 14, w - 20])


def test_card_verdict_colours_and_fixed_size():
    pending = to_array(draw_card({"title": "Q", "question": "1+1?", "answer": "", "verdict": ""}))
    good = to_array(draw_card({"title": "Q", "question": "1+1?", "answer": "2", "verdict": "correct"}))
    bad = to_array(draw_card({"title": "Q", "question": "1+1?", "answer": "3", "verdict": "incorrect (0.1)"}))
    long = to_array(
        draw_card({"title": "Q" * 300, "question": "why " * 2000, "answer": "x" * 5000, "verdict": "v" * 900})
    )
    assert pending.shape == good.shape == bad.shape == long.shape == (CARD_SIZE[1], CARD_SIZE[0], 3)
    assert _pill_color(pending) == COLORS["pending"]
    assert _pill_color(good) == COLORS["correct"]
    assert _pill_color(bad) == COLORS["incorrect"]
    assert verdict_color("Wrong answer") == COLORS["incorrect"]


def test_answer_envs_render_cards_with_stable_size():
    env = gym.make("llmgym/Countdown-v0", render_mode="rgb_array")
    env.reset(seed=1)
    before = env.render()
    card = env.unwrapped.card()
    assert card["answer"] == "" and card["verdict"] == ""
    env.step(format_response(["1 + " * 400 + "1"], "a very long answer"))
    after = env.render()
    assert after.shape == before.shape
    assert env.unwrapped.card()["verdict"] != ""
    assert not np.array_equal(before, after)
    assert _pill_color(before) == COLORS["pending"]
    assert _pill_color(after) == COLORS["incorrect"]


@pytest.mark.parametrize("env_id", llm_gym.list_envs())
def test_every_env_renders_rgb_array(env_id):
    env = gym.make(env_id, render_mode="rgb_array", **OFFLINE_KWARGS.get(env_id, {}))
    env.reset(seed=0)
    frame = env.render()
    assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8
    env.step(env.unwrapped.example_response())
    env.step("not a valid response")
    assert env.render().shape == frame.shape


def test_human_mode_opens_a_window_and_returns_none():
    pg = require_pygame()
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", render_mode="human")
    env.unwrapped.metadata = {**env.unwrapped.metadata, "render_fps": 1000}
    try:
        env.reset(seed=0)
        assert pg.display.get_init()
        assert env.render() is None
        assert pg.display.get_surface().get_size() == (256, 256)
    finally:
        env.close()
    assert not pg.display.get_init()


def test_rgb_array_never_initialises_the_display():
    code = (
        "import gymnasium as gym, llm_gym, pygame\n"
        "from llm_gym.core import format_response\n"
        "for env_id in ['llmgym/Sokoban-v0', 'llmgym/FrozenLake-v0', 'llmgym/Countdown-v0', 'llmgym/Bandit-v0']:\n"
        "    env = gym.make(env_id, render_mode='rgb_array'); env.reset(seed=0)\n"
        "    env.render(); env.step(env.unwrapped.example_response()); env.render(); env.close()\n"
        "print('display', pygame.display.get_init())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "display False" in out.stdout


def test_missing_pygame_gives_install_hint(monkeypatch):
    from gymnasium.error import DependencyNotInstalled

    monkeypatch.setitem(sys.modules, "pygame", None)
    with pytest.raises(DependencyNotInstalled, match=r'pip install "llm-gym\[render\]"'):
        require_pygame()


def test_render_frame_round_trip_and_contiguity():
    env = gym.make("llmgym/Sokoban-v0")
    env.reset(seed=2)
    frame = render_frame(env)
    assert frame.flags["C_CONTIGUOUS"] and frame.flags["WRITEABLE"]
    assert np.array_equal(to_array(from_array(frame)), frame)


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet=st.characters(), max_size=400) | st.text("ab \t\r\n\x00", max_size=200),
    st.integers(min_value=30, max_value=400),
)
def test_wrap_text_lines_fit(text, width):
    fnt = font(18)
    lines = wrap_text(text, fnt, width)
    assert lines
    for line in lines:
        # A single glyph wider than the width is the only allowed overflow.
        assert fnt.size(line)[0] <= width or len(line) == 1
    # Nothing but whitespace is lost (control characters are shown as "?").
    text = text.replace("\r\n", "\n").replace("\t", " ")
    cleaned = "".join(
        ch if ch == "\n" or (ord(ch) >= 32 and not 0xD800 <= ord(ch) <= 0xDFFF) else "?" for ch in text
    )
    assert "".join("".join(lines).split()) == "".join(cleaned.split())


@settings(max_examples=60, deadline=None)
@given(
    st.text(alphabet=st.characters(), max_size=600) | st.text("ab \t\r\n\u0300", max_size=600),
    st.integers(min_value=1, max_value=120),
    st.integers(min_value=0, max_value=4),
)
def test_wrap_text_max_lines_never_hides_that_text_goes_on(text, width, max_lines):
    fnt = font(18)
    full = wrap_text(text, fnt, width)
    limited = wrap_text(text, fnt, width, max_lines)
    assert len(limited) <= max_lines + 1
    assert all(fnt.size(line)[0] <= width or len(line) == 1 for line in limited)
    if len(full) > max_lines:
        assert len(limited) > max_lines


@settings(max_examples=60, deadline=None)
@given(st.text("abcW.-\n ", max_size=800), st.integers(min_value=1, max_value=120), st.integers(0, 4))
def test_wrap_text_max_lines_keeps_the_same_first_lines(text, width, max_lines):
    # No runs of spaces: they vanish at line starts, so the first lines may then hold more text than the cut.
    text = "".join(c for i, c in enumerate(text) if not (c == " " and text[i - 1 : i] == " "))
    fnt = font(18)
    full = wrap_text(text, fnt, width)
    limited = wrap_text(text, fnt, width, max_lines)
    assert limited[:max_lines] == full[:max_lines]
    assert (len(limited) > max_lines) == (len(full) > max_lines)


def test_huge_answer_renders_a_card_fast():
    # Only the lines shown are wrapped: a million-character answer costs no more than a short one.
    for answer in ("7" * 1_000_000, "word " * 200_000, "\n" * 1_000_000):
        card = {
            "title": "Q",
            "question": "why? " * 100_000,
            "answer": answer,
            "verdict": "incorrect " * 10**5,
        }
        start = time.perf_counter()
        frame = to_array(draw_card(card))
        assert time.perf_counter() - start < 0.3
        assert frame.shape == (CARD_SIZE[1], CARD_SIZE[0], 3)


def test_rendering_survives_pygame_quit():
    pg = require_pygame()
    env = gym.make("llmgym/Countdown-v0", render_mode="rgb_array")
    env.reset(seed=0)
    first = env.render()
    pg.quit()  # a user's own pygame code may shut everything down between frames
    env.reset(seed=1)
    second = env.render()
    assert second.shape == first.shape and not np.array_equal(first, second)
