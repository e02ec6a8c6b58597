"""SokobanEnv: Gymnasium conformance, push rules and rewards, observation formats, level sources, fuzzing."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.core import format_response
from llm_gym.envs.sokoban import REMAPPED_VOCAB, SokobanEnv, load_levels, parse_level

SOKOBAN_IDS = [
    "llmgym/Sokoban-v0",
    "llmgym/SokobanLarge-v0",
    "llmgym/SokobanNewVocab-v0",
    "llmgym/CoordSokoban-v0",
    "llmgym/SokobanFile-v0",
]

# Player left of a box, a goal beyond it, a second box below: exercises pushes and blocking.
CORRIDOR = """\
#######
#@$ . #
#  $ .#
#######"""
SYMBOLS = "#####\n#+$ #\n#* .#\n#  $#\n#####"


def act(*names: str) -> str:
    return format_response(list(names), "test")


def make(level: str = CORRIDOR, **kwargs) -> SokobanEnv:
    env = SokobanEnv(max_actions_per_turn=4, max_actions=50, max_turns=50, **kwargs)
    env.reset(seed=0, options={"level": level})
    return env


@pytest.mark.parametrize("env_id", SOKOBAN_IDS)
def test_check_env_clean(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


@pytest.mark.parametrize("env_id", SOKOBAN_IDS)
def test_defaults_and_budget(env_id):
    env = gym.make(env_id).unwrapped
    assert (env.max_turns, env.max_actions_per_turn, env.max_actions) == (5, 2, 10)
    _, info = env.reset(seed=3)
    assert info["solver_status"] == "solved"
    # Default levels are solvable within the action budget.
    assert 1 <= info["optimal_length"] <= env.max_actions


def test_push_moves_box_and_rewards_reaching_target():
    env = make()
    _, reward, terminated, _, info = env.step(act("Right"))
    assert env.player == (1, 2) and (1, 3) in env.boxes
    assert info["action_is_effective"] and reward == pytest.approx(-0.1)
    _, reward, terminated, _, info = env.step(act("Right"))
    assert (1, 4) in env.boxes
    assert info["reward_components"]["box_on_target"] == 1.0
    assert reward == pytest.approx(0.9) and not terminated
    assert info["boxes_on_target"] == 1
    # Pushing it further takes it off the target.
    _, reward, _, _, info = env.step(act("Right"))
    assert (1, 5) in env.boxes
    assert info["reward_components"]["box_off_target"] == -1.0
    assert reward == pytest.approx(-1.1)
    assert sum(info["reward_components"].values()) == pytest.approx(reward)


def test_box_into_wall_or_box_is_blocked():
    env = make("######\n#@$# #\n#  . #\n######")
    board = env.board()
    _, reward, _, _, info = env.step(act("Right"))
    assert env.board() == board and env.player == (1, 1)
    assert not info["action_is_effective"] and info["action_is_valid"]
    assert reward == pytest.approx(-0.1)
    env = make("#######\n#@$$..#\n#######")
    board = env.board()
    _, _, _, _, info = env.step(act("Right"))
    assert env.board() == board and not info["action_is_effective"]
    _, _, _, _, info = env.step(act("Up"))  # into a wall
    assert env.board() == board and not info["action_is_effective"]


def test_solving_gives_bonus_and_terminates():
    env = make("#######\n#@$ .##\n#######")
    _, reward, terminated, truncated, info = env.step(act("Right", "Right", "Left"))
    assert terminated and not truncated and info["success"]
    assert info["actions"] == ["Right", "Right"]  # the third action is never run
    assert info["reward_components"] == {
        "step": pytest.approx(-0.2),
        "box_on_target": 1.0,
        "box_off_target": 0.0,
        "solved": 10.0,
        "format_penalty": 0.0,
    }
    assert reward == pytest.approx(10.8)
    assert env.board() == ["#######", "#  @*##", "#######"]


def test_reward_overrides_and_instructions():
    env = make(rewards={"step": -0.5, "solved": 5.0})
    assert "-0.5 per move" in env.instructions and "+5 when all boxes" in env.instructions
    _, reward, _, _, _ = env.step(act("Down"))
    assert reward == pytest.approx(-0.5)


def test_invalid_text_costs_penalty_and_changes_nothing():
    env = make()
    board, player = env.board(), env.player
    for text in ["no tags", act("Jump"), "<think>x</think><answer></answer>", act("Up", "Fly")]:
        _, reward, _, _, info = env.step(text)
        assert not info["action_is_valid"] and info["error"]
        assert reward == pytest.approx(-0.1) and info["actions"] == []
        assert env.board() == board and env.player == player


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.text(max_size=60),
            st.lists(st.sampled_from(["Up", "down", "LEFT", "Right", "x"]), min_size=1, max_size=3).map(
                lambda a: act(*a)
            ),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_step_fuzz_never_raises_and_keeps_invariants(responses):
    env = SokobanEnv(max_actions_per_turn=3, max_actions=40, max_turns=40)
    env.reset(seed=11)
    for text in responses:
        before = env.board()
        obs, reward, terminated, truncated, info = env.step(text)
        assert isinstance(obs, str) and env.observation_space.contains(obs)
        assert sum(info["reward_components"].values()) == pytest.approx(reward)
        if not info["action_is_valid"]:
            assert env.board() == before
        assert len(env.boxes) == 1 and env.player not in env.walls and not (env.boxes & env.walls)
        if terminated or truncated:
            break


def test_grid_symbols_and_board():
    # Player on a target, boxes, a box on target, an empty target.
    env = make(SYMBOLS)
    assert env.board() == SYMBOLS.split("\n")
    assert env._observation() == "#####\n#SX_#\n#√_O#\n#__X#\n#####"


def test_remapped_vocab_and_custom_vocab():
    env = make(SYMBOLS, vocab="remapped")
    assert env._observation() == "WWWWW\nW@B.W\nWC.GW\nW..BW\nWWWWW"
    assert "W wall" in env.instructions and "A player" in env.instructions
    custom = dict(REMAPPED_VOCAB, wall="█")
    env = make(vocab=custom)
    assert "█" in env._observation() and env.observation_space.contains(env._observation())
    with pytest.raises(ValueError, match="distinct"):
        SokobanEnv(vocab=dict(REMAPPED_VOCAB, wall="."))
    with pytest.raises(ValueError, match="vocab"):
        SokobanEnv(vocab="klingon")


def test_grid_coord_observation():
    env = make("######\n#+$ .#\n#  *$#\n######", observation_format="grid_coord")
    obs = env._observation()
    assert obs.split("\n")[:6] == [
        "Coordinates:",
        "Board: 4 rows x 6 cols (zero-indexed, (row, col))",
        "Targets: (1, 1), (1, 4), (2, 3)",
        "Boxes: (1, 2), (2, 4)",
        "Boxes on target: (2, 3)",
        "Player on target: (1, 1)",
    ]
    assert obs.endswith("Grid Map:\n######\n#SX_O#\n#__√X#\n######")
    assert "(row, column)" in env.instructions


def test_file_variant_by_seed_and_index(tmp_path):
    env = gym.make("llmgym/SokobanFile-v0").unwrapped
    levels = load_levels("sample")
    seen = set()
    for seed in range(30):
        _, info = env.reset(seed=seed)
        assert info["level_source"] == "file"
        assert info["level"] == "\n".join(levels[info["level_index"]].rows())
        seen.add(info["level_index"])
    assert len(seen) > 10
    _, info = env.reset(seed=0, options={"level_index": 5})
    assert info["level_index"] == 5 and env.level == levels[5]
    with pytest.raises(ValueError, match="level_index"):
        env.reset(options={"level_index": len(levels)})
    path = tmp_path / "two.xsb"
    path.write_text("; a\n#####\n#@$.#\n#####\n\n; b\n######\n#@$ .#\n######\n")
    env = SokobanEnv(level_file=str(path))
    _, info = env.reset(options={"level_index": 1})
    assert info["optimal_length"] == 2 and env.level.name == "b"


def test_options_level_and_errors():
    env = SokobanEnv()
    _, info = env.reset(seed=0, options={"level": "#######\n#@$ .##\n#######"})
    assert info["level_source"] == "options" and info["optimal_length"] == 2
    _, info = env.reset(seed=0, options={"level": parse_level("#####\n#$ .#\n# @ #\n#####")})
    assert info["solver_status"] == "unsolvable" and info["optimal_length"] is None
    with pytest.raises(ValueError, match="unknown character"):
        env.reset(options={"level": "#####\n#@$x#\n#####"})
    with pytest.raises(ValueError, match="already solved"):
        env.reset(options={"level": "#####\n#@* #\n#####"})
    with pytest.raises(ValueError, match="level_file"):
        env.reset(options={"level_index": 0})
    with pytest.raises(ValueError, match="too large"):
        env.reset(options={"level": "\n".join(["#" * 80] + ["#@$." + " " * 75 + "#"] + ["#" * 80] * 60)})
    with pytest.raises(ValueError, match="observation_format"):
        SokobanEnv(observation_format="pixels")


@pytest.mark.parametrize("observation_format", ["grid", "grid_coord"])
def test_large_room_gets_an_observation_space_that_fits(observation_format):
    env = gym.make(
        "llmgym/Sokoban-v0", dim_room=(70, 70), num_boxes=2, observation_format=observation_format
    ).unwrapped
    obs, info = env.reset(seed=0)
    assert len(info["level"].split("\n")) == 70 and env.observation_space.contains(obs)
    obs, *_ = env.step(format_response(["Up"], "go"))
    assert env.observation_space.contains(obs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)


def test_solver_budget_at_reset():
    env = SokobanEnv(solver_max_states=3)
    _, info = env.reset(options={"level": "#########\n#@      #\n#  $    #\n#      .#\n#########"})
    assert info["solver_status"] == "budget_exhausted" and info["optimal_length"] is None


def test_truncation_after_budget():
    env = gym.make("llmgym/Sokoban-v0")
    env.reset(seed=5)
    for turn in range(1, 6):
        _, _, terminated, truncated, info = env.step("garbage")
        assert info["turn"] == turn and truncated == (turn == 5)
    assert truncated and not terminated


@pytest.mark.parametrize("env_id", ["llmgym/Sokoban-v0", "llmgym/SokobanLarge-v0"])
def test_render_modes(env_id):
    env = gym.make(env_id, render_mode="rgb_array")
    env.reset(seed=1)
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.ndim == 3 and frame.dtype == np.uint8
    env = gym.make(env_id, render_mode="ansi")
    obs, _ = env.reset(seed=1)
    assert env.render() == obs
