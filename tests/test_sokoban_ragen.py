"""RAGEN's Sokoban generator (generator="ragen"): reverse play, validity, determinism, distribution."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import llm_gym  # noqa: F401
from llm_gym.envs.sokoban import RagenGeneratorConfig, generate_ragen_level, solve
from llm_gym.envs.sokoban.ragen_generator import RAGEN_MASKS, ragen_topology, reverse_play


def _corridor():
    """A 3x7 room whose interior is the single row 1, columns 1..5 (flat index = 7 * row + col)."""
    floor = bytearray(21)
    for c in range(1, 6):
        floor[7 + c] = 1
    return floor


def test_reverse_play_pulls_the_box_as_far_as_the_corridor_allows():
    # Box (= target) at column 2, player at column 3: pulling right twice leaves the box at column 4.
    assert reverse_play(_corridor(), 7, [9], 10, 300) == (12, (11,), 2)


@pytest.mark.parametrize(("depth", "expected"), [(2, (10, (9,), 0)), (3, (11, (10,), 1))])
def test_reverse_play_depth_is_the_dfs_time_to_live(depth, expected):
    # ttl 2 expands only the start (score 0: the box covers its target); ttl 3 allows one pull.
    assert reverse_play(_corridor(), 7, [9], 10, depth) == expected


def test_reverse_play_scores_zero_when_no_target_can_be_uncovered():
    # Player between two boxes in a one-wide corridor: no move is possible, so the generator must redraw.
    assert reverse_play(_corridor(), 7, [9, 11], 10, 300)[2] == 0


def test_masks_are_ragens_five_3x3_masks():
    assert len(RAGEN_MASKS) == 5
    assert all((0, 0) in m and all(abs(r) <= 1 and abs(c) <= 1 for r, c in m) for m in RAGEN_MASKS)


def test_topology_keeps_the_border_as_wall():
    floor = ragen_topology(np.random.default_rng(0), (6, 6), 20, 0.35)
    border = [i for i in range(36) if i // 6 in (0, 5) or i % 6 in (0, 5)]
    assert not any(floor[i] for i in border) and any(floor)


@pytest.mark.parametrize("seed", range(40))
def test_generated_levels_are_unsolved_solvable_and_measured_exactly(seed):
    gen = generate_ragen_level(np.random.default_rng(seed))
    assert not gen.level.is_solved
    assert gen.optimal_length == solve(gen.level).length >= 1


def test_same_seed_same_level_and_config_validation():
    a = generate_ragen_level(np.random.default_rng(7))
    b = generate_ragen_level(np.random.default_rng(7))
    assert a == b
    with pytest.raises(ValueError, match="search_depth"):
        RagenGeneratorConfig(search_depth=0)


def test_env_ids_use_ragens_search_depths():
    depths = {
        "llmgym/RagenSokoban-v0": 300,
        "llmgym/RagenCoordSokoban-v0": 300,
        "llmgym/RagenSokobanLarge-v0": 10,
        "llmgym/RagenSokobanNewVocab-v0": 30,
    }
    for env_id, depth in depths.items():
        env = gym.make(env_id).unwrapped
        assert isinstance(env.generator, RagenGeneratorConfig) and env.generator.search_depth == depth
        _, info = env.reset(seed=1)
        assert info["level_source"] == "generated" and info["optimal_length"] >= 1
    assert gym.make("llmgym/RagenSokobanLarge-v0").unwrapped.generator.dim_room == (8, 8)


def test_default_generator_is_unchanged_and_search_depth_needs_ragen():
    env = gym.make("llmgym/Sokoban-v0").unwrapped
    assert not isinstance(env.generator, RagenGeneratorConfig)
    with pytest.raises(ValueError, match="search_depth"):
        gym.make("llmgym/Sokoban-v0", search_depth=10)
    with pytest.raises(ValueError, match="generator"):
        gym.make("llmgym/Sokoban-v0", generator="other")


def test_ragen_levels_are_easier_than_ours():
    # RAGEN's generator gives many 1-move levels; ours never goes below min_optimal_length=2.
    ours = gym.make("llmgym/Sokoban-v0").unwrapped
    ragen = gym.make("llmgym/RagenSokoban-v0").unwrapped
    ones = sum(ragen.reset(seed=s)[1]["optimal_length"] == 1 for s in range(200))
    assert ones >= 5
    assert all(ours.reset(seed=s)[1]["optimal_length"] >= 2 for s in range(50))


@pytest.mark.slow
def test_distribution_matches_ragens_generator_on_2000_seeds():
    # RAGEN's generator on 2,000 seeds: length 1 in 8.3%, <= 2 in 31%, > 10 in 0.7%, mean 4.21. Two 2,000-seed
    # samples differ by ~1.5 pp (sd) on the <= 2 share, so the bounds are 3 pp / 0.3.
    lengths = np.array([generate_ragen_level(np.random.default_rng(s)).optimal_length for s in range(2000)])
    assert abs(np.mean(lengths == 1) - 0.083) < 0.02
    assert abs(np.mean(lengths <= 2) - 0.31) < 0.03
    assert abs(np.mean(lengths > 10) - 0.007) < 0.02
    assert abs(lengths.mean() - 4.21) < 0.3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dim_room": (4, 4)}, "dim_room rows"),  # a 2x2 interior: no room ever passed reverse play
        ({"dim_room": (6, 101)}, "dim_room cols"),
        ({"dim_room": (6, 6), "num_boxes": 5}, "num_boxes"),
        ({"search_depth": 1001}, "search_depth"),
        ({"search_depth": 10**12}, "search_depth"),
        ({"num_steps": 10**9}, "num_steps"),
        ({"max_rooms": 10**9}, "max_rooms"),
        ({"solver_max_states": 10**8}, "solver_max_states"),
        ({"p_change_directions": "x"}, "p_change_directions"),
    ],
)
def test_ragen_config_bounds(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RagenGeneratorConfig(**kwargs)
    # The env takes the same bounds at construction, not at reset.
    env_kwargs = {k: v for k, v in kwargs.items() if k in ("dim_room", "num_boxes", "search_depth")}
    if env_kwargs:
        with pytest.raises(ValueError):
            gym.make("llmgym/Sokoban-v0", generator="ragen", **env_kwargs)


def test_ragen_rooms_share_one_explored_state_budget(monkeypatch):
    import time

    from llm_gym.envs.sokoban import ragen_generator

    # 18 boxes in a 20x20 room: rooms keep failing; only the budget over all rooms ends the search.
    monkeypatch.setattr(ragen_generator, "TOTAL_EXPLORED", 20_000)
    config = RagenGeneratorConfig(dim_room=(20, 20), num_boxes=18, search_depth=1000, max_rooms=100_000)
    start = time.monotonic()
    with pytest.raises(ValueError, match="reverse-play states"):
        generate_ragen_level(np.random.default_rng(0), config)
    assert time.monotonic() - start < 5


def test_env_forwards_solver_max_states_to_ragen_generator():
    env = gym.make(
        "llmgym/Sokoban-v0", generator="ragen", dim_room=(10, 10), num_boxes=3, solver_max_states=3
    ).unwrapped
    assert env.generator.solver_max_states == 3
    with pytest.raises(ValueError, match="solver_max_states"):  # a clear ValueError, not a RuntimeError
        env.reset(seed=0)
    with pytest.raises(ValueError, match="solver_max_states"):
        gym.make("llmgym/Sokoban-v0", generator="ragen", solver_max_states=0)
