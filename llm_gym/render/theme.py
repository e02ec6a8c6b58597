"""Colours and sizes shared by every drawing module (one place to restyle the renderer)."""

from __future__ import annotations

Color = tuple[int, int, int]

#: Tile colours. Each sprite's centre pixel is its own key colour, so tests can sample cell centres.
COLORS: dict[str, Color] = {
    # Sokoban
    "wall": (96, 72, 60),
    "mortar": (70, 52, 44),
    "floor": (226, 218, 200),
    "floor_edge": (210, 200, 180),
    "goal": (214, 64, 72),
    "box": (205, 145, 62),
    "box_edge": (140, 92, 34),
    "box_on_goal": (78, 168, 96),
    "box_on_goal_edge": (40, 110, 60),
    "player": (52, 92, 200),
    "player_edge": (24, 44, 110),
    "skin": (250, 214, 170),
    # FrozenLake
    "ice": (206, 232, 246),
    "ice_shine": (236, 247, 252),
    "ice_edge": (170, 205, 228),
    "hole": (28, 48, 92),
    "hole_rim": (90, 130, 170),
    "lake_goal": (240, 196, 40),
    "lake_goal_edge": (170, 120, 10),
    "start": (186, 220, 240),
    "fallen": (200, 40, 40),
    # Cards, panels and text
    "background": (246, 244, 238),
    "panel": (255, 255, 255),
    "panel_edge": (200, 196, 186),
    "title_bar": (52, 62, 84),
    "title_text": (250, 250, 250),
    "text": (28, 28, 32),
    "muted": (110, 110, 118),
    "correct": (46, 140, 70),
    "incorrect": (196, 52, 52),
    "pending": (120, 120, 130),
    "warning": (190, 40, 40),
    "highlight": (255, 244, 200),
}

#: Largest board side in pixels when the cell size is chosen automatically.
BOARD_MAX_PX = 384
#: Cell size bounds in pixels.
CELL_MIN, CELL_MAX = 12, 64
#: Cell sizes a caller may ask for, and the largest board side in pixels: bigger surfaces cost hundreds of MB
#: and very large sprite scales crash SDL (``--cell 5000`` ended in SIGSEGV).
CELL_LIMITS = (4, 256)
BOARD_LIMIT_PX = 4096
#: Size of answer cards and of the text-card fallback.
CARD_SIZE = (480, 320)


def auto_cell(n_rows: int, n_cols: int, max_px: int = BOARD_MAX_PX) -> int:
    """The cell size that fits an ``n_rows x n_cols`` board into ``max_px`` pixels."""
    return max(CELL_MIN, min(CELL_MAX, max_px // max(1, n_rows, n_cols)))
