"""Optimal Sokoban solving by breadth-first search over (player, boxes) states.

A state is one integer ``box_mask * size + player`` over the flattened board (``cell = row * width + col``), so
hashing and moves are plain integer arithmetic. Every player step costs 1 (pushes included), so BFS finds a
solution with the fewest moves. Boxes on "dead" cells (from which no push sequence can bring a box to any goal,
ignoring other boxes) are pruned; that never removes a solution.

:func:`backward_layers` runs the same search backwards (moves and pulls) from the solved positions; the level
generator uses it to get exact optimal lengths of every position it can pick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from llm_gym.core.checks import is_int
from llm_gym.envs.sokoban.level import SokobanLevel, parse_level

#: Action names in RAGEN's order (ids 1-4: Up, Down, Left, Right).
ACTIONS: tuple[str, ...] = ("Up", "Down", "Left", "Right")
#: Row/column offset of each action.
DELTAS: tuple[tuple[int, int], ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))

SolveStatus = Literal["solved", "unsolvable", "budget_exhausted"]


@dataclass(frozen=True)
class SolveResult:
    """What :func:`solve` found.

    ``status``: ``"solved"`` (``plan`` is an optimal list of action names and ``length == len(plan)``),
    ``"unsolvable"`` (the whole reachable state space was searched) or ``"budget_exhausted"`` (more than
    ``max_states`` states would be needed; ``plan`` is empty and ``length`` is ``None``).
    ``explored``: distinct states stored.
    """

    status: SolveStatus
    plan: list[str] = field(default_factory=list)
    length: int | None = None
    explored: int = 0

    @property
    def solved(self) -> bool:
        return self.status == "solved"


@dataclass(frozen=True)
class Board:
    """The fixed part of a level, flattened for search: ``wall[i]`` and ``live[i]`` are 0/1 per cell."""

    width: int
    size: int
    wall: bytes
    goal_mask: int
    live: bytes

    @property
    def deltas(self) -> tuple[int, int, int, int]:
        w = self.width
        return (-w, w, -1, 1)


def make_board(height: int, width: int, wall: bytes | bytearray, goal_mask: int) -> Board:
    """A :class:`Board` with its live cells computed (the wall must enclose every cell the player can reach)."""
    size = height * width
    wall = bytes(wall)
    live = bytearray(size)
    deltas = (-width, width, -1, 1)
    stack = [i for i in range(size) if (goal_mask >> i) & 1]
    for i in stack:
        live[i] = 1
    # A box at x can be pushed to x + d when the player fits at x - d: walk that backwards from the goals.
    while stack:
        y = stack.pop()
        for d in deltas:
            x = y - d
            if 0 <= x - d < size and not live[x] and not wall[x] and not wall[x - d]:
                live[x] = 1
                stack.append(x)
    return Board(width, size, wall, goal_mask, bytes(live))


def compile_level(level: SokobanLevel) -> tuple[Board, int, int]:
    """``(board, player_index, box_mask)`` for ``level``."""
    w = level.width
    wall = bytearray(level.height * w)
    for r, c in level.walls:
        wall[r * w + c] = 1
    goal_mask = 0
    for r, c in level.goals:
        goal_mask |= 1 << (r * w + c)
    box_mask = 0
    for r, c in level.boxes:
        box_mask |= 1 << (r * w + c)
    pr, pc = level.player
    return make_board(level.height, w, wall, goal_mask), pr * w + pc, box_mask


def solve(level: SokobanLevel | str, *, max_states: int = 1_000_000) -> SolveResult:
    """An optimal (fewest player moves, pushes included) solution of ``level``.

    Args:
        level: a :class:`SokobanLevel` or one level in XSB text.
        max_states: give up with ``status="budget_exhausted"`` once more states than this would be stored.
    """
    if isinstance(level, str):
        level = parse_level(level)
    if not is_int(max_states, numpy=False) or max_states < 0:
        raise ValueError(f"max_states must be a non-negative integer, got {max_states!r}")
    board, player, boxes = compile_level(level)
    goal = board.goal_mask
    if boxes == goal:
        return SolveResult("solved", [], 0, 1)
    wall, live, size, deltas = board.wall, board.live, board.size, board.deltas
    if any((boxes >> i) & 1 and not live[i] for i in range(size)):
        return SolveResult("unsolvable", [], None, 1)
    start = boxes * size + player
    parent: dict[int, tuple[int, int]] = {start: (-1, -1)}
    if max_states < 1:
        return SolveResult("budget_exhausted", [], None, 1)
    frontier = [start]
    while frontier:
        nxt: list[int] = []
        for key in frontier:
            mask, p = divmod(key, size)
            for a, d in enumerate(deltas):
                q = p + d
                if wall[q]:
                    continue
                if (mask >> q) & 1:
                    r = q + d
                    if wall[r] or (mask >> r) & 1 or not live[r]:
                        continue
                    nmask = mask ^ (1 << q) ^ (1 << r)
                    nk = nmask * size + q
                    if nk in parent:
                        continue
                    parent[nk] = (key, a)
                    if nmask == goal:
                        return SolveResult("solved", *_plan(parent, nk), len(parent))
                else:
                    nk = key + d
                    if nk in parent:
                        continue
                    parent[nk] = (key, a)
                if len(parent) > max_states:
                    return SolveResult("budget_exhausted", [], None, len(parent))
                nxt.append(nk)
        frontier = nxt
    return SolveResult("unsolvable", [], None, len(parent))


def _plan(parent: dict[int, tuple[int, int]], key: int) -> tuple[list[str], int]:
    plan = []
    while True:
        key, a = parent[key]
        if a < 0:
            break
        plan.append(ACTIONS[a])
    plan.reverse()
    return plan, len(plan)


def backward_layers(
    board: Board, floor: list[int], max_depth: int | None, max_states: int
) -> list[list[int]]:
    """States grouped by exact optimal solution length, found by BFS backwards from the solved positions.

    ``layers[d]`` lists the states (``box_mask * size + player``) whose optimal solution takes exactly ``d``
    moves; layer 0 holds the solved positions (boxes on the goals, player on any other ``floor`` cell). The
    search stops after depth ``max_depth`` (``None``: no limit) or once ``max_states`` states are stored; every
    listed state's depth is exact either way (a layer cut by the budget is just incomplete).
    """
    size, wall, goal = board.size, board.wall, board.goal_mask
    deltas = board.deltas
    layer = [goal * size + p for p in floor if not (goal >> p) & 1]
    seen = set(layer)
    layers = [layer]
    while layer and (max_depth is None or len(layers) <= max_depth):
        nxt: list[int] = []
        for key in layer:
            mask, q = divmod(key, size)
            for d in deltas:
                p = q - d
                if wall[p] or (mask >> p) & 1:
                    continue
                # The forward move was a plain step from p to q...
                nk = key - d
                if nk not in seen:
                    seen.add(nk)
                    nxt.append(nk)
                # ...or a push of the box now at q + d, which stood at q before.
                b = q + d
                if (mask >> b) & 1:
                    nk = (mask ^ (1 << b) ^ (1 << q)) * size + p
                    if nk not in seen:
                        seen.add(nk)
                        nxt.append(nk)
            if len(seen) > max_states:
                break
        if not nxt:
            break
        layers.append(nxt)
        if len(seen) > max_states:
            break
        layer = nxt
    return layers


def decode_state(board: Board, key: int) -> tuple[frozenset[tuple[int, int]], tuple[int, int]]:
    """``(boxes, player)`` as ``(row, col)`` cells for a state key."""
    mask, p = divmod(key, board.size)
    w = board.width
    boxes = frozenset(divmod(i, w) for i in range(board.size) if (mask >> i) & 1)
    return boxes, divmod(p, w)
