"""FrozenLake's shortest safe path (breadth-first search): the one solver used by the expert export and baselines."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

#: Moves in Gymnasium's action order (Left, Down, Right, Up): ties between shortest paths go to the earlier move.
DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def shortest_path(desc: Sequence[str], start: tuple[int, int] | None = None) -> list[str] | None:
    """The fewest moves from ``start`` (default: the ``S`` cell) to a ``G`` cell of a FrozenLake map avoiding ``H``
    cells, as deterministic moves (bumping the edge is a wasted move, so never on a shortest path), or ``None``
    when no path exists."""
    rows, cols = len(desc), len(desc[0])
    if start is None:
        start = divmod("".join(desc).index("S"), cols)
    parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == "G":
            path = []
            while parent[cell] is not None:
                cell, move = parent[cell]  # type: ignore[misc]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in DELTAS.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if (
                0 <= nxt[0] < rows
                and 0 <= nxt[1] < cols
                and nxt not in parent
                and desc[nxt[0]][nxt[1]] != "H"
            ):
                parent[nxt] = (cell, move)
                queue.append(nxt)
    return None
