import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llm_gym  # noqa: F401
from llm_gym.envs.frozen_lake.env import ACTIONS, _has_path, generate_map

MOVE = "<think>t</think><answer>{}</answer>"


@pytest.mark.parametrize("generator", ["llmgym", "ragen"])
@pytest.mark.parametrize("size,p", [(4, 0.9), (4, 0.8), (6, 0.5), (8, 0.9), (3, 0.01), (2, 0.01)])
def test_generated_maps_have_a_path(size, p, generator):
    rng = np.random.default_rng(0)
    for _ in range(30):
        rows = generate_map(rng, size, p, generator=generator)
        assert len(rows) == size and all(len(r) == size for r in rows)
        assert "".join(rows).count("S") == 1 and "".join(rows).count("G") == 1
        assert _has_path("".join(rows), size)


def test_has_path():
    assert _has_path("SFHG", 2) is True  # S(0,0) -> F(0,1) -> G(1,1)
    assert _has_path("SHHG", 2) is False
    assert _has_path("SFFHHHGFF", 3) is False


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    actions=st.lists(st.sampled_from(range(4)), min_size=1, max_size=12),
)
def test_dynamics_match_gymnasium_when_deterministic(seed, actions):
    ours = gym.make("llmgym/FrozenLakeDeterministic-v0", max_actions=100, max_turns=100)
    obs, info = ours.reset(seed=seed)
    desc = info["map"]
    theirs = gym.make("FrozenLake-v1", desc=desc, is_slippery=False)
    state, _ = theirs.reset(seed=seed)
    assert divmod(int(state), len(desc)) == tuple(info["player"])
    for a in actions:
        s, r_ref, term_ref, _, _ = theirs.step(a)
        _, r, term, _, info = ours.step(MOVE.format(ACTIONS[a]))
        assert tuple(info["player"]) == divmod(int(s), len(desc))
        assert r == r_ref and term == term_ref
        if term:
            break


def test_slip_probabilities_follow_success_rate():
    env = gym.make("llmgym/FrozenLake-v0", success_rate=0.5)
    env.reset(seed=0)
    counts = {"intended": 0, "side": 0}
    for _ in range(2000):
        env.reset(options={"map": ["FFF", "FSF", "FFG"]})  # no seed: the slip stream continues
        env.step(MOVE.format("Up"))
        r, c = env.unwrapped.player
        assert (r, c) in {(0, 1), (1, 0), (1, 2)}
        counts["intended" if (r, c) == (0, 1) else "side"] += 1
    assert 0.45 < counts["intended"] / 2000 < 0.55


def test_goal_and_hole_end_the_episode():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0")
    env.reset(seed=0, options={"map": ["SG", "HF"]})
    _, r, term, trunc, info = env.step(MOVE.format("right"))
    assert (r, term, trunc, info["success"]) == (1.0, True, False, True)
    env.reset(seed=0, options={"map": ["SG", "HF"]})
    obs, r, term, _, info = env.step(MOVE.format("Down"))
    assert (r, term, info["success"]) == (0.0, True, False) and obs.startswith("_G\nX")


def test_actions_stop_at_game_end_and_budget_truncates():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", max_actions=3, max_turns=10)
    env.reset(seed=0, options={"map": ["SFF", "FFF", "FFG"]})
    _, _, term, trunc, info = env.step("<think>a</think><answer>Left || Left</answer>")
    assert info["actions"] == ["Left", "Left"] and not info["action_is_effective"] and not (term or trunc)
    _, _, term, trunc, info = env.step("<think>a</think><answer>Right || Right</answer>")
    assert info["actions"] == ["Right"] and trunc and not term  # budget of 3 actions used up


def test_turn_limit_truncates():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", max_turns=2)
    env.reset(seed=0, options={"map": ["SFF", "FFF", "FFG"]})
    assert env.step("junk")[3] is False
    _, _, term, trunc, _ = env.step("junk")
    assert trunc and not term


def test_invalid_action_name_executes_nothing():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0")
    obs, _ = env.reset(seed=0, options={"map": ["SFF", "FFF", "FFG"]})
    obs2, r, _, _, info = env.step("<think>a</think><answer>Right || Jump</answer>")
    assert obs2 == obs and r == -0.1 and not info["action_is_valid"] and "Jump" in info["error"]


def test_extra_actions_are_dropped_and_counted():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", max_actions_per_turn=1)
    env.reset(seed=0, options={"map": ["SFF", "FFF", "FFG"]})
    info = env.step("<think>a</think><answer>Right || Down</answer>")[-1]
    assert info["actions"] == ["Right"] and info["dropped_actions"] == 1


def test_answer_only_mode():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", think=False)
    env.reset(seed=0, options={"map": ["SG"]})
    assert env.step("<answer>Right</answer>")[1] == 1.0
    assert "<think>" not in env.unwrapped.instructions


def test_coordinate_observation():
    env = gym.make("llmgym/CoordFrozenLake-v0")
    obs, _ = env.reset(seed=0, options={"map": ["SH", "FG"]})
    assert "Start: (0, 0)" in obs and "Holes: (0, 1)" in obs and obs.endswith("Grid Map:\nPO\n_G")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"size": 1},
        {"p": 0.0},
        {"p": 2},
        {"success_rate": -0.1},
        {"observation_format": "xml"},
        {"max_turns": 0},
        {"max_actions_per_turn": 1.5},
        {"render_mode": "svg"},
        {"generator": "RAGEN"},
    ],
)
def test_bad_arguments_are_clear_errors(kwargs):
    with pytest.raises(ValueError):
        gym.make("llmgym/FrozenLake-v0", **kwargs)


def test_bad_map_option():
    env = gym.make("llmgym/FrozenLake-v0")
    with pytest.raises(ValueError, match="S, F, H, G"):
        env.reset(seed=0, options={"map": ["SX", "FG"]})
    with pytest.raises(ValueError, match="equal-length"):
        env.reset(seed=0, options={"map": ["SFF", "G"]})


def test_step_before_reset_and_after_end():
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", disable_env_checker=True).unwrapped
    with pytest.raises(gym.error.ResetNeeded):
        env.step("x")
    env.reset(seed=0, options={"map": ["SG"]})
    env.step(MOVE.format("Right"))
    obs, r, term, trunc, info = env.step(MOVE.format("Left"))
    assert (r, term, trunc) == (0.0, True, False) and "over" in info["error"]


def test_ansi_render_is_the_observation():
    env = gym.make("llmgym/FrozenLake-v0", render_mode="ansi")
    obs, _ = env.reset(seed=4)
    assert env.render() == obs


@pytest.mark.parametrize("fmt", ["grid", "grid_coord"])
def test_large_maps_stay_inside_the_observation_space(fmt):
    env = gym.make("llmgym/FrozenLake-v0", size=40, p=0.5, observation_format=fmt).unwrapped
    obs, _ = env.reset(seed=0)
    assert obs in env.observation_space


def test_map_option_larger_than_size_is_refused():
    env = gym.make("llmgym/FrozenLake-v0")
    with pytest.raises(ValueError, match="size=5"):
        env.reset(seed=0, options={"map": ["SFFFF", "FFFFF", "FFFFF", "FFFFF", "FFFFG"]})


def test_one_shortest_path_solver_for_the_optimum_and_the_expert():
    from llm_gym.envs.frozen_lake import env as lake
    from llm_gym.envs.frozen_lake.solver import shortest_path

    assert lake.shortest_path is shortest_path  # the optimum and the expert use the family's one solver
    assert shortest_path(["FS", "HG"]) == ["Down"]  # from the S cell by default
    assert shortest_path(["SFF", "HHF", "GFF"]) == ["Right", "Right", "Down", "Down", "Left", "Left"]
    assert shortest_path(["SH", "HG"]) is None
    env = gym.make("llmgym/FrozenLakeDeterministic-v0", max_turns=6, max_actions_per_turn=1).unwrapped
    env.reset(seed=0)
    assert env.optimum_solves({"map": ["SFF", "HHF", "GFF"]}) is True  # 6 moves in 6 one-move turns
    assert env.optimum_solves({"map": ["SH", "HG"]}) is False
    env.reset(seed=0, options={"map": ["SFF", "HHF", "GFF"]})
    move = env.expert_move()
    assert list(move.parts) == ["Right"] and "6 moves" in move.think
