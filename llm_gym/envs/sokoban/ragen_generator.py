"""RAGEN's Sokoban level generator, re-implemented on ``numpy.random.Generator``.

RAGEN (``ragen/env/sokoban/utils.py``, ``generate_room`` and helpers, adapted there from gym-sokoban) builds a
level in four stages; this module follows the same algorithm step by step so that its levels have the same
difficulty distribution (not the same level for a seed: RAGEN draws from the global ``random`` / ``np.random``):

1. Topology (``room_topology_generation``): a walker starts at a uniform cell in ``[1, rows-1] x [1, cols-1]``
   with a uniform direction; on each of ``num_steps`` steps it turns to a uniform direction with probability
   ``p_change_directions``, moves one cell (clamped to the interior) and carves one of five 3x3 floor masks
   centred on itself. The border is wall.
2. Placement (``place_boxes_and_player``): the player on a uniform floor cell, then each target on a uniform
   remaining floor cell; every box starts on its target.
3. Reverse play (``reverse_playing`` / ``depth_first_search`` / ``reverse_move``): a depth-first search over
   "move, pulling the box behind you if any" in the order up, down, left, right, with a time-to-live of
   ``search_depth`` calls and at most 300,000 explored states. A state is keyed by the room as RAGEN stores it
   (player, boxes never pulled, boxes pulled at least once). Its score is ``box_swaps * displacement`` (the
   number of times the pulled box changed, times the summed Manhattan distance of each box from its target),
   and 0 unless every target is uncovered. The first state reaching the highest score is kept. A room whose
   best score is 0 is drawn again.
4. Player jitter (``add_random_player_movement``): with probability 0.8 when the displacement is 1, else 0.5,
   the player walks 1-3 random steps onto free cells it has not visited (continuing with probability 0.5).

RAGEN's ``search_depth`` is 300 by default (``ragen/env/sokoban/config.py``), 10 for ``LargerSokoban`` and 30
for ``SokobanDifferentGridVocab`` (``config/envs.yaml``). The optimal solution length is not part of RAGEN's
generator; :func:`generate_ragen_level` gets it exactly with the BFS solver.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llm_gym.core.checks import is_int
from llm_gym.envs.sokoban.generator import GeneratedLevel
from llm_gym.envs.sokoban.level import SokobanLevel
from llm_gym.envs.sokoban.solver import solve

#: RAGEN's five floor masks as (row, col) offsets from the walker (the 1-cells of each 3x3 mask).
RAGEN_MASKS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
#: Walk directions (the order only matters for which draw picks which direction).
_WALK = ((1, 0), (0, 1), (-1, 0), (0, -1))
#: Reverse-play and jitter action order: up, down, left, right.
_ORDER = ((-1, 0), (1, 0), (0, -1), (0, 1))
#: RAGEN's cap on explored states per reverse play.
MAX_EXPLORED = 300_000
#: Explored states over all rooms drawn for one level (RAGEN retries rooms forever): at most ~10 s of reverse
#: play at reset (100x100 rooms with many boxes) before a ``ValueError``.
TOTAL_EXPLORED = 1_000_000
#: Largest ``search_depth`` accepted (RAGEN uses 10, 30 and 300).
SEARCH_DEPTH_MAX = 1000
#: Largest side of a room (as for our own generator and XSB files).
SIDE_MAX = 100
#: Largest ``num_steps`` of the topology walk (the default is ``int(1.7 * (rows + cols))``, 340 at 100x100).
NUM_STEPS_MAX = 10_000
#: Largest ``max_rooms`` and ``solver_max_states`` (the env's ``SOLVER_MAX_STATES_LIMIT``).
MAX_ROOMS_MAX = 100_000
SOLVER_MAX_STATES_MAX = 10_000_000


def _int_in(name: str, value, minimum: int, maximum: int) -> int:
    if not is_int(value) or not minimum <= value <= maximum:
        raise ValueError(f"{name} must be an integer in [{minimum}, {maximum}], got {str(value)[:50]}")
    return int(value)


@dataclass(frozen=True)
class RagenGeneratorConfig:
    """Knobs of RAGEN's generator (defaults: RAGEN's ``SimpleSokoban``).

    Attributes:
        dim_room: ``(rows, cols)`` including the outer wall; each in [5, 100] (a 4-wide room has a 2x2
            interior, where reverse play can never uncover a target).
        num_boxes: boxes (= targets); at most ``min(dim_room) - 2``.
        search_depth: time-to-live of the reverse-play DFS, at most 1000 (RAGEN: 300; ``LargerSokoban`` 10,
            ``SokobanDifferentGridVocab`` 30).
        p_change_directions: chance per walk step that the walker turns.
        num_steps: random-walk length, at most 10,000 (``None``: ``int(1.7 * (rows + cols))``, gym-sokoban's
            ``num_gen_steps``).
        max_rooms: rooms drawn before giving up with ``ValueError`` (RAGEN retries without bound); the rooms of
            one level also share a budget of ``TOTAL_EXPLORED`` reverse-play states.
        solver_max_states: state budget of the BFS that measures the optimal length (at most 10**7).
    """

    dim_room: tuple[int, int] = (6, 6)
    num_boxes: int = 1
    search_depth: int = 300
    p_change_directions: float = 0.35
    num_steps: int | None = None
    max_rooms: int = 1000
    solver_max_states: int = 1_000_000

    def __post_init__(self):
        dims = tuple(self.dim_room) if isinstance(self.dim_room, (tuple, list)) else ()
        if len(dims) != 2:
            raise ValueError(f"dim_room must be a (rows, cols) pair, got {self.dim_room!r}")
        dims = (
            _int_in("dim_room rows", dims[0], 5, SIDE_MAX),
            _int_in("dim_room cols", dims[1], 5, SIDE_MAX),
        )
        object.__setattr__(self, "dim_room", dims)
        _int_in("num_boxes", self.num_boxes, 1, min(dims) - 2)
        _int_in("search_depth", self.search_depth, 1, SEARCH_DEPTH_MAX)
        try:
            p_change = float(self.p_change_directions)
        except (TypeError, ValueError):
            p_change = float("nan")
        if not 0.0 <= p_change <= 1.0:
            raise ValueError(f"p_change_directions must be in [0, 1], got {self.p_change_directions!r}")
        if self.num_steps is not None:
            _int_in("num_steps", self.num_steps, 1, NUM_STEPS_MAX)
        _int_in("max_rooms", self.max_rooms, 1, MAX_ROOMS_MAX)
        _int_in("solver_max_states", self.solver_max_states, 1, SOLVER_MAX_STATES_MAX)

    @property
    def steps(self) -> int:
        return self.num_steps if self.num_steps is not None else int(1.7 * sum(self.dim_room))


def ragen_topology(rng: np.random.Generator, dim_room: tuple[int, int], num_steps: int, p_change: float):
    """Floor flags (1 = floor) of a room carved by RAGEN's random walk, flattened row-major."""
    h, w = dim_room
    floor = bytearray(h * w)
    dr, dc = _WALK[int(rng.integers(4))]
    r, c = int(rng.integers(1, h)), int(rng.integers(1, w))  # RAGEN's randint(1, dim - 1), both ends included
    for _ in range(num_steps):
        if rng.random() < p_change:
            dr, dc = _WALK[int(rng.integers(4))]
        r = max(min(r + dr, h - 2), 1)
        c = max(min(c + dc, w - 2), 1)
        for sr, sc in RAGEN_MASKS[int(rng.integers(len(RAGEN_MASKS)))]:
            floor[(r + sr) * w + c + sc] = 1
    for i in range(h * w):
        rr, cc = divmod(i, w)
        if rr in (0, h - 1) or cc in (0, w - 1):
            floor[i] = 0
    return floor


def reverse_play(
    floor: bytes | bytearray, width: int, targets: list[int], player: int, search_depth: int
) -> tuple[int, tuple[int, ...], int]:
    """RAGEN's reverse-play DFS from boxes on ``targets`` and the player at ``player`` (flat indices).

    Returns ``(player, box_positions, score)`` of the first state that reached the best score; box ``k`` is the
    one that started on ``targets[k]`` (targets in row-major order, like RAGEN's box mapping).
    """
    return reverse_play_counted(floor, width, targets, player, search_depth)[0]


def reverse_play_counted(
    floor: bytes | bytearray,
    width: int,
    targets: list[int],
    player: int,
    search_depth: int,
    max_explored: int = MAX_EXPLORED,
) -> tuple[tuple[int, tuple[int, ...], int], int]:
    """:func:`reverse_play` with a cap on explored states (RAGEN's 300,000 by default), also returning how many
    states it explored."""
    target_mask = 0
    for t in targets:
        target_mask |= 1 << t
    tr = [divmod(t, width) for t in targets]
    # A frame: (player, boxes by id, box-cell mask, pulled-box-cell mask, pulled ids, box_swaps, last_pull, ttl).
    # The explored key is (player, box cells, pulled-box cells): RAGEN's room array (pulled boxes are 3, boxes
    # never pulled 4). Children are pushed in reverse action order, so they are visited in RAGEN's recursive
    # order.
    stack = [(player, tuple(targets), target_mask, 0, 0, 0, -1, search_depth)]
    explored: set = set()
    best = (player, tuple(targets), -1)
    while stack:
        p, boxes, bmask, pmask, pulled, swaps, last, ttl = stack.pop()
        ttl -= 1
        if ttl <= 0 or len(explored) >= max_explored:
            continue
        key = (p, bmask, pmask)
        if key in explored:
            continue
        explored.add(key)
        if not (target_mask & bmask) and not (target_mask >> p) & 1:
            disp = 0
            for k, b in enumerate(boxes):
                br, bc = divmod(b, width)
                disp += abs(br - tr[k][0]) + abs(bc - tr[k][1])
            score = swaps * disp
        else:
            score = 0
        if score > best[2]:
            best = (p, boxes, score)
        children = []
        for d in (-width, width, -1, 1):
            q = p + d
            if not floor[q] or (bmask >> q) & 1:
                continue  # blocked: RAGEN revisits the same, already explored state, which does nothing
            behind = p - d
            if (bmask >> behind) & 1:
                k = boxes.index(behind)
                move = (1 << behind) | (1 << p)
                npm = pmask ^ move if (pulled >> k) & 1 else pmask | (1 << p)
                children.append(
                    (
                        q,
                        boxes[:k] + (p,) + boxes[k + 1 :],
                        bmask ^ move,
                        npm,
                        pulled | (1 << k),
                        swaps + (k != last),
                        k,
                        ttl,
                    )
                )
            else:
                children.append((q, boxes, bmask, pmask, pulled, swaps, last, ttl))
        stack.extend(reversed(children))
    return best, len(explored)


def _displacement(width: int, targets: list[int], boxes: tuple[int, ...]) -> int:
    total = 0
    for t, b in zip(targets, boxes):
        (tr, tc), (br, bc) = divmod(t, width), divmod(b, width)
        total += abs(tr - br) + abs(tc - bc)
    return total


def _jitter(rng: np.random.Generator, floor, width: int, boxes, player: int, move_probability: float) -> int:
    """RAGEN's ``add_random_player_movement``: 1-3 random steps onto unvisited free cells."""
    if rng.random() > move_probability:
        return player
    visited = [player]
    for steps in range(1, 4):
        options = []
        for dr, dc in _ORDER:
            q = player + dr * width + dc
            if floor[q] and q not in boxes and q not in visited:
                options.append(q)
        if not options:
            break
        player = options[int(rng.integers(len(options)))]
        visited.append(player)
        if steps >= 3 or rng.random() > 0.5:
            break
    return player


def generate_ragen_level(
    rng: np.random.Generator, config: RagenGeneratorConfig | None = None
) -> GeneratedLevel:
    """A level drawn from ``rng`` alone by RAGEN's algorithm, with its exact optimal solution length.

    ``tries`` in the result counts the rooms drawn (RAGEN redraws rooms with too little floor or a best score of
    0). Raises ``ValueError`` (the configuration cannot produce a level within its bounds) when
    ``config.max_rooms`` rooms or ``TOTAL_EXPLORED`` reverse-play states are used up without a usable room
    (RAGEN would retry forever), or when the solver's state budget is too small to measure the level.
    """
    config = config or RagenGeneratorConfig()
    h, w = config.dim_room
    budget = TOTAL_EXPLORED
    for attempt in range(1, config.max_rooms + 1):
        if budget <= 0:
            raise ValueError(
                f"no usable room after exploring {TOTAL_EXPLORED:,} reverse-play states ({attempt - 1} rooms) "
                f"for {config}; use fewer boxes or a smaller room"
            )
        floor = ragen_topology(rng, config.dim_room, config.steps, float(config.p_change_directions))
        cells = [i for i in range(h * w) if floor[i]]
        if len(cells) <= config.num_boxes + 1:
            continue
        player = cells.pop(int(rng.integers(len(cells))))
        targets = []
        for _ in range(config.num_boxes):
            targets.append(cells.pop(int(rng.integers(len(cells)))))
        targets.sort()  # RAGEN's box mapping iterates targets in row-major order
        (p, boxes, score), explored = reverse_play_counted(
            floor, w, targets, player, config.search_depth, min(MAX_EXPLORED, budget)
        )
        budget -= explored
        if score <= 0:
            continue
        disp = _displacement(w, targets, boxes)
        p = _jitter(rng, floor, w, boxes, p, 0.8 if disp == 1 else 0.5)
        level = SokobanLevel(
            h,
            w,
            frozenset(divmod(i, w) for i in range(h * w) if not floor[i]),
            frozenset(divmod(t, w) for t in targets),
            frozenset(divmod(b, w) for b in boxes),
            divmod(p, w),
        )
        result = solve(level, max_states=config.solver_max_states)
        if not result.solved:
            raise ValueError(
                f"could not measure a generated level's optimal length within solver_max_states="
                f"{config.solver_max_states} ({result.status}); raise solver_max_states"
            )
        assert result.length is not None  # solved
        return GeneratedLevel(level, int(result.length), attempt)
    raise ValueError(f"no usable room in {config.max_rooms} draws for {config}")
