"""Seeded Sokoban level generation with exact optimal solution lengths.

1. Topology: a random walk over the room's interior stamps small floor patterns (the walk changes direction with
   probability ``p_change_direction``); the border stays wall.
2. Goals: ``num_boxes`` distinct floor cells.
3. Backward search: BFS from every solved position (boxes on the goals, player anywhere) using reverse moves
   (steps and pulls) up to depth ``max_optimal_length``. Each state found at depth ``d`` is solvable in exactly
   ``d`` moves, which is also the solver's forward result.
4. Pick a depth uniformly among those in ``[min_optimal_length, max_optimal_length]`` that have states, then a
   state uniformly within it.

Every random draw comes from the ``numpy`` generator passed in, so a seed gives the same level in any process.
A topology without a suitable state is redrawn from the same stream; after ``max_tries`` the deepest state seen
is used (its true length is reported), and if no try had any unsolved state an open room with the goals on its
first interior column is used, which always has one. Generation therefore always ends with a solvable level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from llm_gym.core.checks import is_int
from llm_gym.envs.sokoban.level import SokobanLevel
from llm_gym.envs.sokoban.solver import Board, backward_layers, decode_state, make_board

# Floor stamps as (row, col) offsets around the walker; each contains the walker's cell, so the floor stays
# connected.
_STAMPS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
    ((0, 0), (1, 0), (1, 1)),
    ((-1, 0), (0, -1), (0, 0), (0, 1), (1, 0)),
)
_STEPS = ((-1, 0), (1, 0), (0, -1), (0, 1))


def _positive(name: str, value, minimum: int = 1) -> int:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class GeneratorConfig:
    """Difficulty knobs of the generator.

    Attributes:
        dim_room: ``(rows, cols)`` including the outer wall; each at least 5.
        num_boxes: boxes (= goals); at most ``min(dim_room) - 2``.
        min_optimal_length: fewest moves an optimal solution may take (>= 1).
        max_optimal_length: most moves an optimal solution may take (``None``: no bound but ``max_states``).
        p_change_direction: chance per walk step that the walker turns.
        walk_steps: random-walk length (``None``: ``int(1.7 * (rows + cols))``, as in gym-sokoban/RAGEN).
        max_tries: topologies drawn before settling for the deepest state seen.
        max_states: state budget of one backward search.
    """

    dim_room: tuple[int, int] = (6, 6)
    num_boxes: int = 1
    min_optimal_length: int = 1
    max_optimal_length: int | None = 10
    p_change_direction: float = 0.35
    walk_steps: int | None = None
    max_tries: int = 32
    max_states: int = 200_000

    def __post_init__(self):
        dims = tuple(self.dim_room) if isinstance(self.dim_room, (tuple, list)) else ()
        if len(dims) != 2:
            raise ValueError(f"dim_room must be a (rows, cols) pair, got {self.dim_room!r}")
        dims = (_positive("dim_room rows", dims[0], 5), _positive("dim_room cols", dims[1], 5))
        object.__setattr__(self, "dim_room", dims)
        boxes = _positive("num_boxes", self.num_boxes)
        if boxes > min(dims) - 2:
            raise ValueError(f"num_boxes must be at most min(dim_room) - 2 = {min(dims) - 2}, got {boxes}")
        lo = _positive("min_optimal_length", self.min_optimal_length)
        if self.max_optimal_length is not None:
            hi = _positive("max_optimal_length", self.max_optimal_length)
            if hi < lo:
                raise ValueError(f"max_optimal_length ({hi}) must be >= min_optimal_length ({lo})")
        if not 0.0 <= float(self.p_change_direction) <= 1.0:
            raise ValueError(f"p_change_direction must be in [0, 1], got {self.p_change_direction!r}")
        if self.walk_steps is not None:
            _positive("walk_steps", self.walk_steps)
        _positive("max_tries", self.max_tries)
        _positive("max_states", self.max_states)

    @property
    def steps(self) -> int:
        return self.walk_steps if self.walk_steps is not None else int(1.7 * sum(self.dim_room))


class GeneratedLevel(NamedTuple):
    """A generated level, its optimal solution length in moves, and how many topologies were drawn."""

    level: SokobanLevel
    optimal_length: int
    tries: int


def room_topology(rng: np.random.Generator, config: GeneratorConfig) -> bytearray:
    """Wall flags (1 = wall) of a ``rows x cols`` room carved by a random walk, flattened row-major."""
    h, w = config.dim_room
    n = config.steps
    turns = (rng.random(n) < config.p_change_direction).tolist()
    dirs = rng.integers(0, 4, size=n + 1).tolist()
    stamps = rng.integers(0, len(_STAMPS), size=n).tolist()
    r, c = (int(v) for v in rng.integers(1, (h - 1, w - 1)))
    wall = bytearray(b"\x01" * (h * w))
    dr, dc = _STEPS[dirs[n]]
    for i in range(n):
        if turns[i]:
            dr, dc = _STEPS[dirs[i]]
        for sr, sc in _STAMPS[stamps[i]]:
            rr, cc = r + sr, c + sc
            if 0 < rr < h - 1 and 0 < cc < w - 1:
                wall[rr * w + cc] = 0
        r = min(max(r + dr, 1), h - 2)
        c = min(max(c + dc, 1), w - 2)
    return wall


def _open_room(config: GeneratorConfig) -> tuple[bytearray, int]:
    """The fallback: an all-floor interior with the goals down the first interior column."""
    h, w = config.dim_room
    wall = bytearray(h * w)
    for i in range(h * w):
        r, c = divmod(i, w)
        wall[i] = r in (0, h - 1) or c in (0, w - 1)
    goal_mask = 0
    for k in range(config.num_boxes):
        goal_mask |= 1 << ((1 + k) * w + 1)
    return wall, goal_mask


def _to_level(board: Board, h: int, key: int) -> SokobanLevel:
    w = board.width
    walls = frozenset(divmod(i, w) for i in range(board.size) if board.wall[i])
    goals = frozenset(divmod(i, w) for i in range(board.size) if (board.goal_mask >> i) & 1)
    boxes, player = decode_state(board, key)
    return SokobanLevel(h, w, walls, goals, boxes, player)


def generate_level(rng: np.random.Generator, config: GeneratorConfig | None = None) -> GeneratedLevel:
    """A solvable level drawn from ``rng`` alone, with its exact optimal solution length."""
    config = config or GeneratorConfig()
    h, w = config.dim_room
    lo, hi = config.min_optimal_length, config.max_optimal_length
    best: tuple[int, Board, int] | None = None  # (depth, board, state) of the deepest fallback
    for attempt in range(1, config.max_tries + 1):
        wall = room_topology(rng, config)
        floor = [i for i in range(h * w) if not wall[i]]
        if len(floor) <= config.num_boxes + 1:
            continue
        goal_mask = 0
        for j in rng.choice(len(floor), size=config.num_boxes, replace=False).tolist():
            goal_mask |= 1 << floor[j]
        board = make_board(h, w, wall, goal_mask)
        layers = backward_layers(board, floor, hi, config.max_states)
        depths = [d for d in range(lo, len(layers)) if layers[d]]
        if depths:
            d = depths[int(rng.integers(len(depths)))]
            layer = layers[d]
            return GeneratedLevel(_to_level(board, h, layer[int(rng.integers(len(layer)))]), d, attempt)
        deepest = len(layers) - 1
        if deepest >= 1 and (best is None or deepest > best[0]):
            layer = layers[deepest]
            best = (deepest, board, layer[int(rng.integers(len(layer)))])
    if best is None:
        wall, goal_mask = _open_room(config)
        board = make_board(h, w, wall, goal_mask)
        floor = [i for i in range(h * w) if not wall[i]]
        layers = backward_layers(board, floor, max(lo, 1) if hi is None else hi, config.max_states)
        d = min(max(lo, 1), len(layers) - 1)
        layer = layers[d]
        best = (d, board, layer[int(rng.integers(len(layer)))])
    depth, board, key = best
    return GeneratedLevel(_to_level(board, h, key), depth, config.max_tries)
