"""Grid boards (Sokoban, FrozenLake): state -> :class:`BoardLayout` -> Surface.

The static layer (walls, floor, goals, ice, holes) is drawn once per layout and cell size and cached; a frame is
one blit of that layer plus one blit per moving piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from llm_gym.core.checks import is_int
from llm_gym.render.sprites import tile
from llm_gym.render.theme import BOARD_LIMIT_PX, CELL_LIMITS, auto_cell

#: XSB character -> (background tile, piece). ``-`` and ``_`` are floor in some level files.
XSB_TILES: dict[str, tuple[str, str | None]] = {
    "#": ("wall", None),
    " ": ("floor", None),
    "-": ("floor", None),
    "_": ("floor", None),
    ".": ("goal", None),
    "$": ("floor", "box"),
    "*": ("goal", "box_on_goal"),
    "@": ("floor", "player"),
    "+": ("goal", "player"),
}

#: FrozenLake map character -> background tile.
LAKE_TILES = {"S": "start", "F": "ice", "H": "hole", "G": "lake_goal"}


@dataclass(frozen=True)
class BoardLayout:
    """A board to draw: background tile names per cell and the pieces on top, as ``(row, col, piece)``."""

    bases: tuple[tuple[str, ...], ...]
    pieces: tuple[tuple[int, int, str], ...] = ()

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.bases), len(self.bases[0]) if self.bases else 0


def layout_from_xsb(rows: Sequence[str]) -> BoardLayout:
    """Parse Sokoban XSB rows (``#`` wall, `` `` floor, ``.`` goal, ``$`` box, ``*`` box on goal, ``@`` player,
    ``+`` player on goal). Short rows are padded with floor."""
    rows = [str(r) for r in rows]
    if not rows:
        raise ValueError("a Sokoban board needs at least one row")
    width = max(len(r) for r in rows)
    if width == 0:
        raise ValueError("a Sokoban board needs at least one column")
    bases, pieces = [], []
    for r, row in enumerate(rows):
        line = []
        for c, ch in enumerate(row.ljust(width)):
            try:
                base, piece = XSB_TILES[ch]
            except KeyError:
                raise ValueError(f"unknown XSB character {ch!r} at row {r}, column {c}") from None
            line.append(base)
            if piece is not None:
                pieces.append((r, c, piece))
        bases.append(tuple(line))
    return BoardLayout(tuple(bases), tuple(pieces))


def layout_from_lake(desc: Sequence[str], player: tuple[int, int]) -> BoardLayout:
    """A FrozenLake map (rows of ``S F H G``) with the player at ``(row, col)``."""
    rows = [str(r) for r in desc]
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("a FrozenLake map must be a non-empty list of equal-length rows")
    try:
        bases = tuple(tuple(LAKE_TILES[ch] for ch in row) for row in rows)
    except KeyError as e:
        raise ValueError(f"unknown FrozenLake map character {e.args[0]!r}") from None
    pr, pc = (int(v) for v in player)
    if not (0 <= pr < len(rows) and 0 <= pc < len(rows[0])):
        raise ValueError(f"player {player} is outside the {len(rows)}x{len(rows[0])} map")
    piece = "fallen" if rows[pr][pc] == "H" else "player"
    return BoardLayout(bases, ((pr, pc, piece),))


@lru_cache(maxsize=64)
def static_layer(bases: tuple[tuple[str, ...], ...], cell: int):
    """The background of a board (cached: it does not change within an episode)."""
    from llm_gym.render.backend import require_pygame

    pygame = require_pygame()
    n_rows, n_cols = len(bases), len(bases[0])
    surf = pygame.Surface((n_cols * cell, n_rows * cell))
    surf.blits(
        [
            (tile(name, None, cell), (c * cell, r * cell))
            for r, row in enumerate(bases)
            for c, name in enumerate(row)
        ]
    )
    return surf


def check_cell(cell) -> int:
    """``cell`` as an int within :data:`CELL_LIMITS`, or ``ValueError``."""
    lo, hi = CELL_LIMITS
    if not is_int(cell, numpy=False) or not lo <= cell <= hi:
        raise ValueError(f"cell size must be an integer number of pixels in [{lo}, {hi}], got {cell!r}")
    return cell


def draw_board(layout: BoardLayout, cell: int | None = None, target=None):
    """Draw ``layout`` with ``cell``-pixel tiles (chosen to fit ``BOARD_MAX_PX`` when ``None``).

    Draws into ``target`` when it is given and has the board's size, else into a new Surface; returns it."""
    n_rows, n_cols = layout.shape
    cell = auto_cell(n_rows, n_cols) if cell is None else check_cell(cell)
    if max(n_rows, n_cols) * cell > BOARD_LIMIT_PX:
        raise ValueError(
            f"a {n_rows}x{n_cols} board with {cell}-pixel cells is larger than {BOARD_LIMIT_PX} pixels; "
            "choose a smaller cell"
        )
    background = static_layer(layout.bases, cell)
    if target is None or target.get_size() != background.get_size():
        target = background.copy()
    else:
        target.blit(background, (0, 0))
    if layout.pieces:
        target.blits(
            [(tile(layout.bases[r][c], piece, cell), (c * cell, r * cell)) for r, c, piece in layout.pieces]
        )
    return target
