"""Board sprites drawn in code with pygame primitives, cached per cell size.

Every tile is an opaque ``cell x cell`` Surface; moving pieces (boxes, the player) are pre-composed onto each
background they can stand on, so drawing a board is one opaque blit per cell. The centre pixel of every tile is
its key colour in :data:`~llm_gym.render.theme.COLORS` (tests sample it).
"""

from __future__ import annotations

import math
from functools import lru_cache

from llm_gym.render.theme import COLORS

#: Background tiles.
BASES = ("floor", "wall", "goal", "ice", "start", "hole", "lake_goal")
#: Pieces drawn on top of a background tile.
PIECES = ("box", "box_on_goal", "player", "fallen")


def _pygame():
    from llm_gym.render.backend import require_pygame

    return require_pygame()


def _w(cell: int, frac: float) -> int:
    """A line width proportional to the cell, at least one pixel."""
    return max(1, round(cell * frac))


def _draw_base(pg, surf, name: str, c: int) -> None:
    C = COLORS
    if name in ("floor", "goal"):
        surf.fill(C["floor"])
        pg.draw.line(surf, C["floor_edge"], (0, c - 1), (c - 1, c - 1))
        pg.draw.line(surf, C["floor_edge"], (c - 1, 0), (c - 1, c - 1))
        if name == "goal":
            pg.draw.circle(surf, C["goal"], (c // 2, c // 2), max(3, round(c * 0.28)), _w(c, 0.05))
            pg.draw.circle(surf, C["goal"], (c // 2, c // 2), max(2, round(c * 0.13)))
    elif name == "wall":
        surf.fill(C["wall"])
        t = _w(c, 0.04)
        for y in (round(c * 0.25), round(c * 0.75)):
            pg.draw.line(surf, C["mortar"], (0, y), (c, y), t)
        for x, (y0, y1) in ((c * 0.35, (0, 0.25)), (c * 0.35, (0.75, 1.0)), (c * 0.82, (0.25, 0.75))):
            pg.draw.line(surf, C["mortar"], (round(x), round(c * y0)), (round(x), round(c * y1)), t)
        pg.draw.rect(surf, C["mortar"], (0, 0, c, c), t)
    elif name in ("ice", "start", "hole", "lake_goal"):
        surf.fill(C["start"] if name == "start" else C["ice"])
        pg.draw.line(surf, C["ice_edge"], (0, c - 1), (c - 1, c - 1))
        pg.draw.line(surf, C["ice_edge"], (c - 1, 0), (c - 1, c - 1))
        if name != "hole":
            t = _w(c, 0.04)
            pg.draw.line(
                surf, C["ice_shine"], (round(c * 0.12), round(c * 0.3)), (round(c * 0.3), round(c * 0.12)), t
            )
            pg.draw.line(
                surf,
                C["ice_shine"],
                (round(c * 0.12), round(c * 0.45)),
                (round(c * 0.45), round(c * 0.12)),
                t,
            )
        if name == "hole":
            rim = pg.Rect(round(c * 0.08), round(c * 0.18), round(c * 0.84), round(c * 0.64))
            pg.draw.ellipse(surf, C["hole_rim"], rim)
            pg.draw.ellipse(surf, C["hole"], rim.inflate(-_w(c, 0.1) * 2, -_w(c, 0.1) * 2))
        elif name == "lake_goal":
            cx = cy = c / 2
            r_out, r_in = c * 0.36, c * 0.15
            pts = [
                (
                    cx + (r_out if k % 2 == 0 else r_in) * math.sin(k * math.pi / 5),
                    cy - (r_out if k % 2 == 0 else r_in) * math.cos(k * math.pi / 5),
                )
                for k in range(10)
            ]
            pg.draw.polygon(surf, C["lake_goal"], pts)
            pg.draw.polygon(surf, C["lake_goal_edge"], pts, _w(c, 0.03))
    else:
        raise ValueError(f"unknown base tile {name!r}; known: {', '.join(BASES)}")


def _draw_piece(pg, surf, name: str, c: int) -> None:
    C = COLORS
    if name in ("box", "box_on_goal"):
        fill, edge = (C["box"], C["box_edge"]) if name == "box" else (C["box_on_goal"], C["box_on_goal_edge"])
        outer = pg.Rect(round(c * 0.1), round(c * 0.1), c - 2 * round(c * 0.1), c - 2 * round(c * 0.1))
        pg.draw.rect(surf, fill, outer)
        pg.draw.rect(surf, edge, outer, _w(c, 0.07))
        inner = outer.inflate(-round(c * 0.24), -round(c * 0.24))
        pg.draw.rect(surf, edge, inner, _w(c, 0.03))
    elif name in ("player", "fallen"):
        body_color = C["player"] if name == "player" else C["fallen"]
        body = pg.Rect(round(c * 0.27), round(c * 0.4), round(c * 0.46), round(c * 0.5))
        pg.draw.ellipse(surf, body_color, body)
        pg.draw.ellipse(surf, C["player_edge"], body, _w(c, 0.04))
        head_r = max(2, round(c * 0.14))
        pg.draw.circle(surf, C["skin"], (c // 2, round(c * 0.26)), head_r)
        pg.draw.circle(surf, C["player_edge"], (c // 2, round(c * 0.26)), head_r, _w(c, 0.03))
        if name == "fallen":
            t = _w(c, 0.05)
            pg.draw.line(
                surf,
                C["player_edge"],
                (round(c * 0.2), round(c * 0.75)),
                (round(c * 0.8), round(c * 0.75)),
                t,
            )
    else:
        raise ValueError(f"unknown piece {name!r}; known: {', '.join(PIECES)}")
    # The key colour at the exact centre, whatever rounding did to the shapes above.
    key = {"box": "box", "box_on_goal": "box_on_goal", "player": "player", "fallen": "fallen"}[name]
    surf.set_at((c // 2, c // 2), C[key])


@lru_cache(maxsize=256)
def tile(base: str, piece: str | None, cell: int):
    """An opaque ``cell x cell`` Surface: ``base`` with ``piece`` (or nothing) on top."""
    if cell < 4:
        raise ValueError(f"cell size must be at least 4 pixels, got {cell}")
    pg = _pygame()
    surf = pg.Surface((cell, cell))
    _draw_base(pg, surf, base, cell)
    if piece is not None:
        _draw_piece(pg, surf, piece, cell)
    return surf
