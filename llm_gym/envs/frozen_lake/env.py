"""FrozenLake as a text game for LLM agents (RAGEN's variant of Gymnasium's FrozenLake)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from llm_gym.core import ExpertMove, RagenPrompt, RewardSpec, TextEnv
from llm_gym.core.checks import is_int, is_number
from llm_gym.envs.frozen_lake.solver import shortest_path

# Gymnasium's action order: 0 Left, 1 Down, 2 Right, 3 Up.
ACTIONS = ("Left", "Down", "Right", "Up")
_DELTAS = ((0, -1), (1, 0), (0, 1), (-1, 0))
_INDEX = {name: i for i, name in enumerate(ACTIONS)}
#: Largest board side (``size``, and each side of a ``map`` given at reset): bounds reset time and observation
#: length (a 64x64 ``grid_coord`` observation is about 53k characters).
MAX_SIZE = 64
#: ``observation_style`` values: our coordinate text, or RAGEN's exact one.
OBSERVATION_STYLES = ("llmgym", "ragen")
#: ``generator`` values: how a map is drawn from the seed (same distribution, different map per seed).
GENERATORS = ("llmgym", "ragen")

# RAGEN's prompt text for FrozenLake, verbatim (RAGEN-2's protocol is defined by it): the instructions and "max
# words" hints (``max_tokens``) of FrozenLake and CoordFrozenLake in RAGEN's ``config/envs.yaml``, and the symbol
# meanings of ``ragen/env/frozen_lake/config.py``.
_RAGEN_TEXT = (
    "You are solving the FrozenLake puzzle. Forbid the whole and go to the target. You may move to the unintended "
    "direction due to the slippery ice. Example answer format: <think>To forbid the hole and go to the target, I "
    "should go left then go up.</think><answer>Left || Up</answer>"
)
_RAGEN_COORD_TEXT = (
    "You are solving the FrozenLake puzzle. The observation includes both a symbol grid and zero-indexed "
    "coordinates for the start, goal, player, and any holes.\nCoordinates range from the top-left corner (0, 0) "
    "to the bottom-right corner (5, 5).\nBeware that the ice is slippery, so the agent might slide and end up in "
    "an unintended tile.\nRespond with a sequence of actions such as <answer>Left || Up || Up</answer>.\n"
)
# shown in both observation formats: RAGEN's config merge never sees the nested ``observation_format``
# (ragen/llm_agent/ctx_manager.py:126-132), so CoordFrozenLake's prompt has the legend too
_RAGEN_LEGEND = "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal"


def generate_map(
    rng: np.random.Generator, size: int, p: float, max_tries: int = 200, generator: str = "llmgym"
) -> list[str]:
    """A ``size x size`` map of ``S F H G`` rows: frozen with probability ``p``, random distinct start and goal,
    and a path from start to goal. After ``max_tries`` failed draws a path is carved from the same stream, so
    generation always ends.

    ``generator="ragen"`` makes RAGEN's random calls (``ragen/env/frozen_lake/utils.py:99-104``): the board as one
    ``choice`` over ``F``/``H``, then start and goal as ``(row, col)`` pairs, the whole draw repeated until they
    differ and a path exists; seeded like RAGEN's env (``reset(seed=s)``), it gives RAGEN's map for seed ``s``.
    ``"llmgym"`` draws start and goal as flat indices, the goal among the other cells (fewer redraws).
    """
    n = size * size
    cells: list[str] = []
    start = goal = 0
    for _ in range(max_tries):
        if generator == "ragen":
            cells = rng.choice(["F", "H"], (size, size), p=[p, 1 - p]).ravel().tolist()
            (sr, sc), (gr, gc) = rng.integers(size, size=2), rng.integers(size, size=2)
            start, goal = int(sr) * size + int(sc), int(gr) * size + int(gc)
            if start == goal:
                continue
        else:
            cells = ["F" if f else "H" for f in (rng.random(n) < p).tolist()]
            start, goal = int(rng.integers(n)), int(rng.integers(n - 1))
            goal += goal >= start  # uniform over cells other than the start
        cells[start], cells[goal] = "S", "G"
        if _has_path(cells, size):
            break
    else:
        if start == goal:  # the last RAGEN-style draw put both on one cell
            goal = (start + 1) % n
            cells[start], cells[goal] = "S", "G"
        # Carve an L-shaped path of frozen cells from S to G (rare: only for tiny p).
        (r, c), (gr, gc) = divmod(start, size), divmod(goal, size)
        while (r, c) != (gr, gc):
            if r != gr:
                r += 1 if gr > r else -1
            else:
                c += 1 if gc > c else -1
            if cells[r * size + c] == "H":
                cells[r * size + c] = "F"
    return ["".join(cells[r * size : (r + 1) * size]) for r in range(size)]


def _has_path(cells: Sequence[str], size: int) -> bool:
    """Whether a flat row-major board has a hole-free 4-connected path from ``S`` to a ``G``."""
    start = cells.index("S")
    stack, seen = [start], {start}
    while stack:
        i = stack.pop()
        if cells[i] == "G":
            return True
        r, c = divmod(i, size)
        for j, ok in ((i - 1, c > 0), (i + 1, c < size - 1), (i - size, r > 0), (i + size, r < size - 1)):
            if ok and j not in seen and cells[j] != "H":
                seen.add(j)
                stack.append(j)
    return False


def _validate_map(rows: Any) -> list[str]:
    # A bare string would iterate as one-letter rows ("SFFG" is not a 4x1 board); None is not a map either.
    if isinstance(rows, str) or not isinstance(rows, Sequence) or len(rows) > MAX_SIZE:
        raise ValueError(
            f"map must be a list of at most {MAX_SIZE} equal-length strings of S, F, H, G, got {_short(rows)}"
        )
    if not all(isinstance(r, str) and len(r) <= MAX_SIZE for r in rows):
        raise ValueError(f"map rows must be strings of at most {MAX_SIZE} characters, got {_short(rows)}")
    rows = list(rows)
    if not rows or any(len(r) != len(rows[0]) for r in rows):
        raise ValueError("map must be a non-empty list of equal-length rows")
    text = "".join(rows)
    bad = sorted(set(text) - set("SFHG"))
    if bad:
        raise ValueError(f"map may only contain S, F, H, G; found {bad}")
    if text.count("S") != 1 or text.count("G") < 1:
        raise ValueError("map needs exactly one S and at least one G")
    return rows


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class FrozenLakeEnv(TextEnv):
    """Cross a frozen lake from the start to the goal without falling into a hole.

    ## Description
    RAGEN's text FrozenLake: a random ``size x size`` map where each cell is frozen with probability ``p``
    (otherwise a hole), a random start and goal that differ, and a guaranteed path. Moves may slip: the intended
    direction is taken with probability ``success_rate`` and each perpendicular direction with
    ``(1 - success_rate) / 2`` (Gymnasium's semantics). Walking into the border leaves the player in place.

    ## Action
    ``Left``, ``Down``, ``Right``, ``Up`` (case-insensitive), several per turn separated by ``||``.

    ## Observation
    ``grid`` (default): rows of ``P`` player, ``_`` frozen (the start is shown as frozen), ``O`` hole, ``G`` goal,
    ``X`` player in a hole, ``√`` player on the goal. ``grid_coord``: a coordinate block, then the grid.
    ``observation_style="ragen"`` writes that block exactly as RAGEN does (``ragen/env/frozen_lake/utils.py``,
    ``format_coordinate_render``, and ``ragen/env/frozen_lake/env.py``, ``_render_text``): ``Coordinates: `` and
    ``Grid Map: `` headers with a trailing space, ``Board size: R rows x C cols (zero-indexed).``, start, goal,
    player, then the holes, a line with no entries (no holes) left out.

    ## Starting state
    A new map drawn from ``np_random`` (or the map given as ``options={"map": rows}``: equal-length ``S F H G``
    strings, at most ``size`` by ``size``), with the player on the start cell.

    ## Rewards
    ``goal`` +1 when the goal is reached; ``hole`` (0) when falling in; ``step`` (0) per executed action;
    ``format_penalty`` -0.1 per invalid turn.

    ## Episode end
    Terminated on the goal (success) or in a hole; truncated after ``max_turns`` turns or ``max_actions``
    executed actions.

    ## Information
    ``reset`` adds ``map`` (the rows, in ``S F H G``); every ``info`` adds ``player`` (``(row, col)``).

    ## Arguments
    * ``size``: side of a generated map, default 4, at most ``MAX_SIZE`` (64).
    * ``p``: probability that a cell is frozen, default 0.9.
    * ``success_rate``: probability that a move goes the intended way, default 0.8.
    * ``observation_format``: ``"grid"`` (default) or ``"grid_coord"``.
    * ``observation_style``: ``"llmgym"`` (default) or ``"ragen"`` (RAGEN's exact coordinate text; ``grid`` is
      the same in both).
    * ``generator``: ``"llmgym"`` (default) or ``"ragen"`` (RAGEN's random calls, so ``reset(seed=s)`` gives the
      map RAGEN's env draws for seed ``s``; the same distribution either way).
    * The common ``TextEnv`` arguments.

    ## Version history
    * v0: initial version. ``generator`` was added later; its default keeps every v0 id's maps.
    * ``llmgym/RagenCoordFrozenLake-v1``: v0 of that id plus ``generator="ragen"``, so its seeds give RAGEN's
      maps (RAGEN-2's 512 validation maps are seeds 123-634). ``-v0`` keeps llm-gym's draw.
    """

    game_reward_spec = RewardSpec.of(
        ("goal", 1.0, "reaching the goal"),
        ("hole", 0.0, "falling into a hole"),
        ("step", 0.0, "every executed action"),
    )
    action_names = ACTIONS
    expert_name = "bfs-shortest-path"
    # size, p and generator shape the map draw; they stay the server operator's
    light_kwargs = ("success_rate", "observation_format", "observation_style")
    reset_options = ("map",)

    def __init__(
        self,
        *,
        size: int = 4,
        p: float = 0.9,
        success_rate: float = 0.8,
        observation_format: str = "grid",
        observation_style: str = "llmgym",
        generator: str = "llmgym",
        **kwargs: Any,
    ):
        if not is_int(size) or not 2 <= size <= MAX_SIZE:
            raise ValueError(f"size must be an integer in [2, {MAX_SIZE}], got {size!r}")
        size = int(size)
        # numbers only: float("0.5") and float(True) would quietly accept a string or a boolean
        if not is_number(p) or not 0.0 < float(p) <= 1.0:
            raise ValueError(f"p (frozen probability) must be a number in (0, 1], got {p!r}")
        if not is_number(success_rate) or not 0.0 <= float(success_rate) <= 1.0:
            raise ValueError(f"success_rate must be a number in [0, 1], got {success_rate!r}")
        if observation_format not in ("grid", "grid_coord"):
            raise ValueError(f"observation_format must be 'grid' or 'grid_coord', got {observation_format!r}")
        if observation_style not in OBSERVATION_STYLES:
            raise ValueError(
                f"observation_style must be one of {OBSERVATION_STYLES}, got {observation_style!r}"
            )
        if generator not in GENERATORS:
            raise ValueError(f"generator must be one of {GENERATORS}, got {generator!r}")
        self.generator = generator
        self.size, self.p, self.success_rate = size, float(p), float(success_rate)
        self.observation_format = observation_format
        self.observation_style = observation_style
        # Grid rows plus, for grid_coord, a header and up to size^2 "(r, c), " hole entries.
        self.obs_max_length = size * (size + 1) + (
            0 if observation_format == "grid" else 200 + 12 * size * size
        )
        super().__init__(**kwargs)
        self.desc: list[str] = []
        self._rows: list[str] = []
        self.player = (0, 0)
        self._obs: str | None = None

    def _rules(self) -> str:
        slip = (
            "Moves always go where you intend."
            if self.success_rate >= 1.0
            else f"The ice is slippery: a move goes the intended way with probability {self.success_rate:.2f}, "
            "otherwise sideways."
        )
        return (
            "You are walking on a frozen lake. Reach the goal without falling into a hole. "
            f"{slip}\nSymbols: P player, _ frozen ice, O hole, G goal, X player in a hole, √ player on the goal."
        )

    def _reset_game(self, options: dict[str, Any]) -> dict[str, Any]:
        if "map" in options:
            self.desc = _validate_map(options["map"])
            if len(self.desc) > self.size or len(self.desc[0]) > self.size:
                raise ValueError(
                    f"map is {len(self.desc)}x{len(self.desc[0])} but this env has size={self.size}; "
                    f"make it with size={max(len(self.desc), len(self.desc[0]))} or more"
                )
        else:
            self.desc = generate_map(self.np_random, self.size, self.p, generator=self.generator)
        start = "".join(self.desc).index("S")
        self.player = divmod(start, len(self.desc[0]))
        self._obs = None
        self._rows = [
            "".join("O" if ch == "H" else "G" if ch == "G" else "_" for ch in row) for row in self.desc
        ]
        return {"map": list(self.desc)}

    def _cell(self, pos: tuple[int, int]) -> str:
        return self.desc[pos[0]][pos[1]]

    def _apply_action(self, action: str) -> tuple[dict[str, float], bool]:
        a = _INDEX[action]
        if self.success_rate < 1.0:
            u = self.np_random.random()
            side = (1.0 - self.success_rate) / 2
            if u < side:
                a = (a - 1) % 4
            elif u >= side + self.success_rate:
                a = (a + 1) % 4
        dr, dc = _DELTAS[a]
        r, c = self.player
        nr = min(max(r + dr, 0), len(self.desc) - 1)
        nc = min(max(c + dc, 0), len(self.desc[0]) - 1)
        moved = (nr, nc) != self.player
        self.player = (nr, nc)
        self._obs = None
        cell = self._cell(self.player)
        spec = self.reward_spec
        parts = {"step": spec["step"]}
        if cell == "G":
            parts["goal"] = spec["goal"]
        elif cell == "H":
            parts["hole"] = spec["hole"]
        return parts, moved

    def _is_terminated(self) -> bool:
        return bool(self.desc) and self._cell(self.player) in "GH"

    def _is_success(self) -> bool:
        return bool(self.desc) and self._cell(self.player) == "G"

    def _grid(self) -> str:
        rows = list(self._rows)  # static cells, rendered once per reset
        pr, pc = self.player
        mark = {"H": "X", "G": "√"}.get(self.desc[pr][pc], "P")
        rows[pr] = rows[pr][:pc] + mark + rows[pr][pc + 1 :]
        return "\n".join(rows)

    def _observation(self) -> str:
        if self._obs is None:
            grid = self._grid()
            if self.observation_format == "grid":
                self._obs = grid
            elif self.observation_style == "ragen":
                self._obs = "Coordinates: \n" + self._ragen_coords() + "\nGrid Map: \n" + grid
            else:
                self._obs = self._coords() + "\nGrid Map:\n" + grid
        return self._obs

    def _ragen_coords(self) -> str:
        # RAGEN's collect_entity_coordinates + format_coordinate_render: cells row-major, empty lines left out.
        def where(ch: str) -> str:
            return ", ".join(
                f"({r}, {c})" for r, row in enumerate(self.desc) for c, x in enumerate(row) if x == ch
            )

        label = {"G": "Player on goal", "H": "Player in hole"}.get(self._cell(self.player), "Player")
        lines = [f"Board size: {len(self.desc)} rows x {len(self.desc[0])} cols (zero-indexed)."]
        for name, cells in (
            ("Start", where("S")),
            ("Goal", where("G")),
            (label, f"({self.player[0]}, {self.player[1]})"),
            ("Holes", where("H")),
        ):
            if cells:
                lines.append(f"{name}: {cells}")
        return "\n".join(lines)

    def _coords(self) -> str:
        def where(ch: str) -> list[tuple[int, int]]:
            return [(r, c) for r, row in enumerate(self.desc) for c, x in enumerate(row) if x == ch]

        n_rows, n_cols = len(self.desc), len(self.desc[0])
        cell = self._cell(self.player)
        label = {"G": "Player on goal", "H": "Player in hole"}.get(cell, "Player")
        holes = ", ".join(f"({r}, {c})" for r, c in where("H")) or "none"
        return (
            f"Coordinates:\nBoard: {n_rows} rows x {n_cols} cols (zero-indexed, (row, col))\n"
            f"Start: {where('S')[0]}\nGoal: {where('G')[0]}\n{label}: {self.player}\nHoles: {holes}"
        )

    def _extra_info(self) -> dict[str, Any]:
        return {"player": self.player}

    # ------------------------------------------------------------------------------- family knowledge
    def optimum_solves(self, info: Mapping[str, Any]) -> bool | None:
        if self.success_rate < 1.0:
            return None  # slippery: no exact optimum without solving the MDP
        path = shortest_path(info["map"])
        return self.within_limits(None if path is None else len(path))

    def expert_move(self) -> ExpertMove | None:
        """The shortest hole-free path from here (breadth-first search over the map), ``max_actions_per_turn``
        moves per turn: optimal when moves are deterministic. On slippery ice no plan is sure to succeed: the
        expert takes one move per turn while it has turns to spare (more only when it would run out) and
        re-plans after every slip; export keeps only the episodes that reach the goal (slips come from the
        seeded env, so a kept episode replays identically), successful but not optimal in expectation."""
        path = shortest_path(self.desc, (self.player[0], self.player[1]))
        if not path or len(path) > self.actions_left:
            return None
        k = self.max_actions_per_turn
        if self.success_rate < 1.0:
            # Slippery: look at the result of each move unless the turns left cannot fit the path that way.
            k = min(k, max(1, math.ceil(len(path) / max(1, self.turns_left))))
        chunk = path[:k]
        think = f"The shortest safe path to the goal from here is {len(path)} moves: {', '.join(path)}."
        if self.success_rate < 1.0:
            think += " The ice is slippery, so I re-plan after every turn."
        return ExpertMove(think, chunk)

    def ragen_prompt(self) -> RagenPrompt | None:
        if self.observation_format == "grid":
            return RagenPrompt(_RAGEN_TEXT, _RAGEN_LEGEND, 100)
        return RagenPrompt(_RAGEN_COORD_TEXT, _RAGEN_LEGEND, 120)
