"""The optimal solver against an independent brute-force BFS, and its statuses."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from llm_gym.envs.sokoban import GeneratorConfig, SokobanLevel, generate_level, parse_level, solve
from llm_gym.envs.sokoban.solver import backward_layers, compile_level, make_board

_MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


def _step(walls, boxes, player, name):
    """Plain-rules move on sets of cells; returns the new (boxes, player)."""
    dr, dc = _MOVES[name]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in walls:
        return boxes, player
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in walls or beyond in boxes:
            return boxes, player
        return (boxes - {nxt}) | {beyond}, nxt
    return boxes, nxt


def brute_force_length(level: SokobanLevel) -> int | None:
    """Fewest moves by exhaustive BFS over (player, boxes), no pruning; ``None`` if unsolvable."""
    start = (level.player, level.boxes)
    if level.boxes == level.goals:
        return 0
    dist = {start: 0}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, boxes = state
        for name in _MOVES:
            nb, np_ = _step(level.walls, boxes, player, name)
            nxt = (np_, nb)
            if nxt in dist:
                continue
            dist[nxt] = dist[state] + 1
            if nb == level.goals:
                return dist[nxt]
            queue.append(nxt)
    return None


def replay(level: SokobanLevel, plan: list[str]) -> bool:
    boxes, player = level.boxes, level.player
    for name in plan:
        boxes, player = _step(level.walls, boxes, player, name)
    return boxes == level.goals


def _random_small_level(rng: np.random.Generator) -> SokobanLevel:
    """A random enclosed room (not necessarily solvable): random inner walls, boxes, goals and player."""
    while True:
        h, w = int(rng.integers(4, 8)), int(rng.integers(4, 8))
        n_boxes = int(rng.integers(1, 3))
        inner = [(r, c) for r in range(1, h - 1) for c in range(1, w - 1)]
        walls = {(r, c) for r in range(h) for c in range(w) if r in (0, h - 1) or c in (0, w - 1)}
        walls |= {cell for cell in inner if rng.random() < 0.2}
        free = [cell for cell in inner if cell not in walls]
        if len(free) < 2 * n_boxes + 1:
            continue
        picks = rng.choice(len(free), size=2 * n_boxes + 1, replace=False)
        boxes = {free[i] for i in picks[:n_boxes]}
        goals = {free[i] for i in picks[n_boxes : 2 * n_boxes]}
        player = free[picks[-1]]
        try:
            return SokobanLevel(h, w, frozenset(walls), frozenset(goals), frozenset(boxes), player)
        except ValueError:
            continue  # a box or goal walled off from the player


def test_solver_is_optimal_against_brute_force():
    rng = np.random.default_rng(123)
    outcomes = {"solved": 0, "unsolvable": 0}
    for _ in range(600):
        level = _random_small_level(rng)
        expected = brute_force_length(level)
        result = solve(level)
        if expected is None:
            assert result.status == "unsolvable"
            assert result.plan == [] and result.length is None
        else:
            assert result.status == "solved"
            assert result.length == expected == len(result.plan)
            assert replay(level, result.plan)
        outcomes[result.status] += 1
    # The sample must exercise both outcomes for the comparison to mean something.
    assert outcomes["solved"] >= 50 and outcomes["unsolvable"] >= 50, outcomes


def test_generated_levels_match_brute_force():
    rng = np.random.default_rng(7)
    for cfg in (GeneratorConfig(), GeneratorConfig(dim_room=(7, 7), num_boxes=2, max_optimal_length=8)):
        for _ in range(20):
            gen = generate_level(rng, cfg)
            assert brute_force_length(gen.level) == gen.optimal_length


def test_known_level_and_text_input():
    result = solve("#######\n#@ $ .#\n#######")
    assert result.solved
    assert result.plan == ["Right", "Right", "Right"]
    assert result.length == 3


def test_already_solved_level_has_empty_plan():
    result = solve("#####\n#@* #\n#   #\n#####")
    assert result.status == "solved" and result.plan == [] and result.length == 0


def test_dead_box_is_unsolvable_immediately():
    # The box sits in a corner that is not a goal.
    result = solve("#####\n#$ .#\n# @ #\n#####")
    assert result.status == "unsolvable"
    assert result.explored == 1


def test_budget_exhausted_is_reported():
    level = parse_level("#########\n#@      #\n#  $    #\n#       #\n#      .#\n#########")
    assert solve(level).solved
    result = solve(level, max_states=5)
    assert result.status == "budget_exhausted"
    assert result.plan == [] and result.length is None and not result.solved
    with pytest.raises(ValueError, match="max_states"):
        solve(level, max_states=-1)


def test_backward_layers_are_exact_solution_lengths():
    level = parse_level("######\n#    #\n# $  #\n#  . #\n#@   #\n######")
    board, _, _ = compile_level(level)
    board = make_board(level.height, level.width, board.wall, board.goal_mask)
    floor = [i for i in range(board.size) if not board.wall[i]]
    layers = backward_layers(board, floor, None, 10_000)
    w = level.width
    for depth, layer in enumerate(layers[1:], start=1):
        for key in layer[:5]:
            mask, p = divmod(key, board.size)
            boxes = frozenset(divmod(i, w) for i in range(board.size) if (mask >> i) & 1)
            assert solve(level.with_state(boxes, divmod(p, w))).length == depth
