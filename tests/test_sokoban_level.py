"""XSB level parsing, formatting and the malformed-level errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gym.envs.sokoban import (
    GeneratorConfig,
    SokobanLevel,
    format_collection,
    format_xsb,
    generate_level,
    load_levels,
    parse_level,
    parse_levels,
    sample_path,
)

SIMPLE = """\
#####
#@$.#
#####"""


def test_parse_simple_level():
    level = parse_level(SIMPLE)
    assert (level.height, level.width) == (3, 5)
    assert level.player == (1, 1)
    assert level.boxes == {(1, 2)}
    assert level.goals == {(1, 3)}
    assert (0, 0) in level.walls and (1, 1) not in level.walls
    assert not level.is_solved
    assert format_xsb(level) == SIMPLE
    assert level.rows() == SIMPLE.split("\n")


def test_player_and_box_on_goal_and_alternative_floor():
    text = "######\n#+*$-#\n#_   #\n######"
    level = parse_level(text)
    assert level.player == (1, 1) and (1, 1) in level.goals
    assert level.boxes == {(1, 2), (1, 3)}
    assert level.goals == {(1, 1), (1, 2)}
    assert format_xsb(level) == "######\n#+*$ #\n#    #\n######"


def test_ragged_rows_and_outside_become_walls():
    text = "  ####\n###  #\n#@$. #\n######\n"
    level = parse_level(text)
    assert level.width == 6
    # The outside spaces of the first row are walls after normalisation.
    assert format_xsb(level) == "######\n###  #\n#@$. #\n######"
    # Missing cells of a short row count as outside too.
    short = parse_level("#####\n#@$.#\n####")
    assert (2, 4) in short.walls


def test_collection_with_boxoban_separators_names_and_metadata():
    text = (
        "; header comment\n\n; 0\n#####\n#@$.#\n#####\n\n; 1\n######\n#.$@ #\n######\n"
        "Title: second\n\n;2\n#######\n#@ $ .#\n#######\n"
    )
    levels = parse_levels(text)
    assert [lv.name for lv in levels] == ["0", "1", "2"]
    assert levels[1].player == (1, 3) and levels[1].goals == {(1, 1)}
    assert levels[2].boxes == {(1, 3)}


def test_format_collection_round_trip():
    rng = np.random.default_rng(5)
    levels = [generate_level(rng, GeneratorConfig(dim_room=(7, 7), num_boxes=2)).level for _ in range(5)]
    again = parse_levels(format_collection(levels, header="made in a test\nsecond line"))
    assert again == levels
    assert [lv.name for lv in again] == ["0", "1", "2", "3", "4"]


def test_sample_file_loads():
    levels = load_levels("sample")
    assert len(levels) >= 24
    assert load_levels(sample_path()) == levels
    assert all(lv.num_boxes >= 1 for lv in levels)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("#####\n#@$x#\n#####", "line 2, column 4: unknown character 'x'"),
        ("#####\n#@$.#\n#\t  #\n#####", "line 3, column 2: unknown character '\\t'"),
        ("#####\n# $.#\n#####", "lines 1-3: the level has no player"),
        ("######\n#@$.@#\n######", "line 2, column 5: second player"),
        ("#####\n#@ .#\n#####", "the level has no boxes"),
        ("######\n#@$$.#\n######", "the level has 2 boxes but 1 goals"),
        ("#####\n#@$. \n#####", "line 2, column 2: the player's area is not enclosed"),
        ("#######\n#@ #$.#\n#######", "line 2, column 5: box is not reachable from the player"),
        ("#######\n#@$#. #\n#######", "line 2, column 5: goal is not reachable from the player"),
    ],
)
def test_malformed_levels_name_line_and_problem(text, message):
    with pytest.raises(ValueError) as err:
        parse_level(text)
    assert message in str(err.value)


def test_errors_in_a_collection_use_file_line_numbers(tmp_path):
    path = tmp_path / "bad.xsb"
    path.write_text("; 0\n#####\n#@$.#\n#####\n\n; 1\n#####\n#@$?#\n#####\n")
    with pytest.raises(ValueError, match=r"bad\.xsb: line 8, column 4: unknown character '\?'"):
        load_levels(path)


def test_empty_text_missing_file_and_several_levels():
    with pytest.raises(ValueError, match="no level found"):
        parse_levels("; only a comment\n\n")
    with pytest.raises(ValueError, match="cannot read level file"):
        load_levels("/nonexistent/levels.xsb")
    with pytest.raises(ValueError, match="expected one level, found 2"):
        parse_level(SIMPLE + "\n\n" + SIMPLE)
    with pytest.raises(ValueError, match="must be a str"):
        parse_level(None)  # type: ignore[arg-type]


def test_level_constructor_validates():
    good = parse_level(SIMPLE)
    with pytest.raises(ValueError, match="2 boxes but 1 goals"):
        good.with_state({(1, 2), (1, 3)}, (1, 1))
    with pytest.raises(ValueError, match="player .* is on a box"):
        good.with_state({(1, 2)}, (1, 2))
    with pytest.raises(ValueError, match="on a wall"):
        good.with_state({(1, 2)}, (0, 0))
    with pytest.raises(ValueError, match="not enclosed"):
        SokobanLevel(3, 4, frozenset(), frozenset({(1, 2)}), frozenset({(1, 1)}), (1, 0))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="#@+$*. -_\n;xA:\t", max_size=80))
def test_parser_only_raises_value_error(text):
    try:
        levels = parse_levels(text)
    except ValueError:
        return
    for level in levels:
        assert parse_level(format_xsb(level)) == level


def _room(size: int) -> str:
    rows = ["#" * size] + ["#" + " " * (size - 2) + "#" for _ in range(size - 2)] + ["#" * size]
    rows[1] = "#@$." + " " * (size - 5) + "#"
    return "\n".join(rows)


def test_total_board_cells_of_a_text_are_bounded(monkeypatch):
    from llm_gym.envs.sokoban import level as level_module

    text = "\n\n".join([_room(10)] * 12)  # 1,200 cells
    assert len(parse_levels(text)) == 12
    monkeypatch.setattr(level_module, "MAX_TOTAL_CELLS", 1000)
    with pytest.raises(ValueError, match="more than 1,000 board cells"):
        parse_levels(text, source="big.xsb")


def test_load_levels_parses_a_file_once_until_it_changes(tmp_path, monkeypatch):
    import gymnasium as gym

    import llm_gym  # noqa: F401
    from llm_gym.envs.sokoban import level as level_module

    calls = []
    real = level_module.parse_levels
    monkeypatch.setattr(level_module, "parse_levels", lambda *a, **k: calls.append(1) or real(*a, **k))
    path = tmp_path / "levels.xsb"
    path.write_text(_room(8) + "\n\n" + _room(9))
    first = load_levels(path)
    second = load_levels(path)
    assert first == second and first is not second and len(calls) == 1
    # Every SokobanFile env on the file shares the parse.
    for _ in range(3):
        gym.make("llmgym/SokobanFile-v0", level_file=str(path)).reset(seed=0)
    assert len(calls) == 1
    path.write_text(_room(8))  # changed (size differs): parsed again
    assert len(load_levels(path)) == 1 and len(calls) == 2
