"""Sokoban levels: the immutable level record and XSB text parsing/formatting.

XSB notation: ``#`` wall, ``@`` player, ``+`` player on goal, ``$`` box, ``*`` box on goal, ``.`` goal, space
floor (``-`` and ``_`` are accepted as floor too). A collection file holds several levels separated by blank
lines; a line starting with ``;`` is a comment and the last comment before a level names it (Boxoban's ``; N``).

Normalisation: rows may be ragged (they are padded on the right). Columns that hold only spaces in every row of a
level (common indentation, trailing spaces) are outside it and dropped. Cells the player cannot reach (the outside
of the level and sealed-off pockets) become walls, so ``format_xsb(parse_level(t))`` may differ from ``t`` in those
cells only.

Bounds (untrusted files): a level is at most ``LEVEL_MAX_SIDE`` (100) rows and columns after that cropping, a text
holds at most ``MAX_LEVELS`` (10,000) levels and ``MAX_TOTAL_CELLS`` (2,000,000) board cells in all, a level file
at most ``LEVEL_FILE_MAX_BYTES`` (16 MiB); beyond that parsing stops with a ``ValueError`` saying which bound,
before allocating anything per cell of the level over the bound. :func:`load_levels` keeps the parsed levels of
the last few files (keyed by resolved path, modification time and size), so many envs on one file parse it once.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from llm_gym.assets import asset_path

Cell = tuple[int, int]

#: XSB characters accepted on a board line.
XSB_CHARS = "#@+$*. -_"
#: Largest level side (rows or columns, after dropping the all-space columns around it), levels per text, and
#: level file size: parsing costs time and memory in proportion to these, never to the extent of empty space.
LEVEL_MAX_SIDE = 100
MAX_LEVELS = 10_000
LEVEL_FILE_MAX_BYTES = 16 * 1024 * 1024
#: Board cells (rows x columns after cropping) over all levels of one text: parsing runs at ~250,000 cells/s,
#: so this caps one parse at ~8 s (10,000 40x40 levels, 16 M cells, took a minute). 10,000 Boxoban levels are 1 M.
MAX_TOTAL_CELLS = 2_000_000
#: Files whose parsed levels :func:`load_levels` keeps (levels are immutable, so envs share them).
LEVEL_CACHE_SIZE = 8


@dataclass(frozen=True)
class SokobanLevel:
    """A Sokoban position: the fixed room (walls, goals) and the movable parts (boxes, player).

    Coordinates are ``(row, col)``, zero-indexed from the top-left. The player's region must be enclosed by walls
    inside the ``height x width`` rectangle, and there must be as many boxes as goals (at least one).
    """

    height: int
    width: int
    walls: frozenset[Cell]
    goals: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell
    name: str = field(default="", compare=False)

    def __post_init__(self):
        for attr in ("walls", "goals", "boxes"):
            value = getattr(self, attr)
            if not isinstance(value, frozenset):
                object.__setattr__(self, attr, frozenset(tuple(c) for c in value))
        object.__setattr__(self, "player", (int(self.player[0]), int(self.player[1])))
        problem = _structural_problem(self)
        if problem:
            raise ValueError(f"invalid Sokoban level: {problem}")

    @property
    def num_boxes(self) -> int:
        return len(self.boxes)

    @property
    def is_solved(self) -> bool:
        return self.boxes == self.goals

    def rows(self) -> list[str]:
        """The level as XSB rows (see :func:`format_xsb`)."""
        return format_xsb(self).split("\n")

    def with_state(self, boxes, player: Cell) -> SokobanLevel:
        """The same room with other box and player positions."""
        return SokobanLevel(
            self.height, self.width, self.walls, self.goals, frozenset(boxes), player, self.name
        )


def _in_bounds(level: SokobanLevel, cell: Cell) -> bool:
    return 0 <= cell[0] < level.height and 0 <= cell[1] < level.width


def _structural_problem(level: SokobanLevel) -> str | None:
    """Why ``level`` is not a playable position, or ``None``."""
    if level.height < 3 or level.width < 3:
        return f"the board must be at least 3x3, got {level.height}x{level.width}"
    for what, cells in (("wall", level.walls), ("goal", level.goals), ("box", level.boxes)):
        for cell in cells:
            if not _in_bounds(level, cell):
                return f"{what} {cell} is outside the {level.height}x{level.width} board"
    if not _in_bounds(level, level.player):
        return f"player {level.player} is outside the {level.height}x{level.width} board"
    if not level.boxes:
        return "the level has no boxes"
    if len(level.boxes) != len(level.goals):
        return f"the level has {len(level.boxes)} boxes but {len(level.goals)} goals"
    if level.player in level.walls:
        return f"player {level.player} is on a wall"
    if level.player in level.boxes:
        return f"player {level.player} is on a box"
    for what, cells in (("goal", level.goals), ("box", level.boxes)):
        for cell in sorted(cells & level.walls):
            return f"{what} {cell} is on a wall"
    region = player_region(level.height, level.width, level.walls, level.player)
    if region is None:
        return "the player's area is not enclosed by walls"
    for what, cells in (("box", level.boxes), ("goal", level.goals)):
        for cell in sorted(cells - region):
            return f"{what} {cell} is not reachable from the player"
    return None


def player_region(
    height: int, width: int, walls: frozenset[Cell] | set[Cell], start: Cell
) -> set[Cell] | None:
    """Cells reachable from ``start`` through non-wall cells (boxes count as floor), or ``None`` if that area
    touches the edge of the board (the level is open)."""
    seen = {start}
    stack = [start]
    while stack:
        r, c = stack.pop()
        if r in (0, height - 1) or c in (0, width - 1):
            return None
        for nb in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if nb not in seen and nb not in walls:
                seen.add(nb)
                stack.append(nb)
    return seen


# ------------------------------------------------------------------------------------------------ parsing
def _where(source: str, line: int, col: int | None = None) -> str:
    at = f"line {line}" if col is None else f"line {line}, column {col}"
    return f"{source}: {at}" if source else at


def _parse_block(lines: list[str], first_line: int, source: str = "", name: str = "") -> SokobanLevel:
    """One level from its board lines; ``first_line`` is the 1-based line number of ``lines[0]``."""
    block = f"{source}: lines" if source else "lines"
    block += f" {first_line}-{first_line + len(lines) - 1}"
    # Columns of spaces on the left of every row and on the right are outside the level: drop them before
    # anything is allocated per cell, then bound what is left.
    left = min(len(line) - len(line.lstrip(" ")) for line in lines)
    height = len(lines)
    width = max(len(line.rstrip(" ")) for line in lines) - left
    if height > LEVEL_MAX_SIDE or width > LEVEL_MAX_SIDE:
        raise ValueError(
            f"{block}: the level is {height}x{width}; levels may be at most {LEVEL_MAX_SIDE}x{LEVEL_MAX_SIDE}"
        )
    lines = [line[left:].rstrip(" ") for line in lines]
    walls: set[Cell] = set()
    goals: set[Cell] = set()
    boxes: set[Cell] = set()
    player: Cell | None = None
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            if ch not in XSB_CHARS:
                raise ValueError(
                    f"{_where(source, first_line + r, c + 1 + left)}: unknown character {ch!r}; XSB levels use "
                    "# wall, @ player, + player on goal, $ box, * box on goal, . goal, and space, - or _ floor"
                )
            if ch == "#":
                walls.add((r, c))
            if ch in ".+*":
                goals.add((r, c))
            if ch in "$*":
                boxes.add((r, c))
            if ch in "@+":
                if player is not None:
                    raise ValueError(
                        f"{_where(source, first_line + r, c + 1 + left)}: second player; a level has exactly one @ or"
                        f" + (the first is at line {first_line + player[0]}, column {player[1] + 1 + left})"
                    )
                player = (r, c)
    if player is None:
        raise ValueError(f"{block}: the level has no player (@ or +)")
    if not boxes:
        raise ValueError(f"{block}: the level has no boxes ($ or *)")
    if len(boxes) != len(goals):
        raise ValueError(f"{block}: the level has {len(boxes)} boxes but {len(goals)} goals")
    # Pad ragged rows with outside cells (treated as floor until proven unreachable).
    region = player_region(height, width, walls, player)
    if region is None:
        raise ValueError(
            f"{_where(source, first_line + player[0], player[1] + 1 + left)}: the player's area is not enclosed by walls"
        )
    for what, cells in (("box", boxes), ("goal", goals)):
        for r, c in sorted(cells - region):
            raise ValueError(
                f"{_where(source, first_line + r, c + 1 + left)}: {what} is not reachable from the player"
            )
    all_cells = {(r, c) for r in range(height) for c in range(width)}
    return SokobanLevel(
        height, width, frozenset(all_cells - region), frozenset(goals), frozenset(boxes), player, name
    )


def _board_lines(text: str) -> list[str]:
    return [line.rstrip("\r\n") for line in text.replace("\r\n", "\n").split("\n")]


def _is_metadata(line: str) -> bool:
    """``Title: ...``-style lines of XSB collections (skipped); board lines never start with a letter."""
    stripped = line.strip()
    return bool(stripped) and stripped[0].isalpha() and ":" in stripped


def parse_level(text: str, *, source: str = "") -> SokobanLevel:
    """Parse one XSB level from ``text`` (leading/trailing blank and ``;`` comment lines are ignored).

    Raises ``ValueError`` naming the line (and column) of the problem: unknown character, second player, no
    player, no boxes, boxes != goals, an area open to the edge, or a box/goal the player cannot reach.
    """
    if not isinstance(text, str):
        raise ValueError(f"level text must be a str, got {type(text).__name__}")
    levels = parse_levels(text, source=source)
    if len(levels) != 1:
        raise ValueError(f"{source + ': ' if source else ''}expected one level, found {len(levels)}")
    return levels[0]


def parse_levels(text: str, *, source: str = "") -> list[SokobanLevel]:
    """Parse every level of an XSB collection (levels separated by blank or ``;`` comment lines).

    The last ``;`` comment before a level becomes its ``name`` (``"; 12"`` -> ``"12"``). Lines such as
    ``Title: ...`` are skipped. A collection without any level is an error.
    """
    if not isinstance(text, str):
        raise ValueError(f"level text must be a str, got {type(text).__name__}")
    levels: list[SokobanLevel] = []
    block: list[str] = []
    start = 0
    name = ""
    pending = ""
    cells = 0
    for i, line in enumerate([*_board_lines(text), ""], start=1):
        comment = line.lstrip().startswith(";")
        if not line.strip() or comment or _is_metadata(line):
            if block:
                levels.append(_parse_block(block, start, source, name))
                block = []
                cells += levels[-1].height * levels[-1].width
                if cells > MAX_TOTAL_CELLS:
                    raise ValueError(
                        f"{source + ': ' if source else ''}more than {MAX_TOTAL_CELLS:,} board cells in one text "
                        f"(at the level ending on line {i - 1}); split the collection into smaller files"
                    )
            if comment:
                pending = line.lstrip()[1:].strip()
            continue
        if not block:
            if len(levels) >= MAX_LEVELS:
                raise ValueError(
                    f"{source + ': ' if source else ''}more than {MAX_LEVELS} levels in one text"
                )
            start, name, pending = i, pending, ""
        block.append(line)
    if not levels:
        raise ValueError(f"{source + ': ' if source else ''}no level found in the text")
    return levels


_level_cache: OrderedDict[tuple, tuple[SokobanLevel, ...]] = OrderedDict()
_level_cache_lock = threading.Lock()


def load_levels(path: str | os.PathLike) -> list[SokobanLevel]:
    """Every level of an XSB file; ``"sample"`` loads the bundled sample collection.

    The parsed levels of the last :data:`LEVEL_CACHE_SIZE` files are kept, keyed by resolved path, modification
    time and size (a changed file is parsed again); each call returns a new list."""
    path = sample_path() if str(path) == "sample" else Path(path)
    try:
        with Path(path).open("rb") as f:
            st = os.fstat(f.fileno())
            # A regular file's identity; anything else (a pipe, /dev/zero) is read each time.
            # ctime too: a rewrite of the same size with its mtime put back still changes it
            key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if stat.S_ISREG(st.st_mode):
                with _level_cache_lock:
                    cached = _level_cache.get(key)
                    if cached is not None:
                        _level_cache.move_to_end(key)
                        return list(cached)
            data = f.read(LEVEL_FILE_MAX_BYTES + 1)  # bounded: /dev/zero or a huge file must not fill memory
    except OSError as e:
        raise ValueError(f"cannot read level file {str(path)!r}: {e.strerror or e}") from None
    if len(data) > LEVEL_FILE_MAX_BYTES:
        raise ValueError(f"level file {str(path)!r} is larger than {LEVEL_FILE_MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8-sig")  # a UTF-8 byte order mark is skipped
    except UnicodeDecodeError as e:
        raise ValueError(f"level file {str(path)!r} is not valid UTF-8 (byte {e.start})") from None
    levels = parse_levels(text, source=Path(path).name)
    if stat.S_ISREG(st.st_mode) and len(data) == st.st_size:  # not changed while it was read
        with _level_cache_lock:
            _level_cache[key] = tuple(levels)
            while len(_level_cache) > LEVEL_CACHE_SIZE:
                _level_cache.popitem(last=False)
    return levels


def sample_path() -> Path:
    """Path of the bundled sample collection (``assets/sokoban/sample.xsb`` in the repository)."""
    return asset_path("sokoban", "sample.xsb")


# ---------------------------------------------------------------------------------------------- formatting
def format_xsb(level: SokobanLevel) -> str:
    """The level as XSB text (rows joined by newlines, no trailing newline)."""
    grid = [[" "] * level.width for _ in range(level.height)]
    for r, c in level.walls:
        grid[r][c] = "#"
    for r, c in level.goals:
        grid[r][c] = "."
    for r, c in level.boxes:
        grid[r][c] = "*" if (r, c) in level.goals else "$"
    pr, pc = level.player
    grid[pr][pc] = "+" if level.player in level.goals else "@"
    return "\n".join("".join(row) for row in grid)


def format_collection(levels: list[SokobanLevel], *, header: str = "") -> str:
    """A Boxoban-style collection: optional ``;`` header lines, then ``; N`` and the board for each level."""
    out = [f"; {line}".rstrip() for line in header.splitlines()]
    if out:
        out.append("")
    for i, level in enumerate(levels):
        out += [f"; {level.name or i}", format_xsb(level), ""]
    return "\n".join(out)
