"""Sokoban as a multi-turn text game for LLM agents (RAGEN's Sokoban rules, symbols and rewards)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from llm_gym.core import ExpertMove, RagenPrompt, RewardSpec, TextEnv
from llm_gym.core.checks import is_int
from llm_gym.envs.sokoban.generator import GeneratorConfig, generate_level
from llm_gym.envs.sokoban.level import (
    LEVEL_MAX_SIDE,
    Cell,
    SokobanLevel,
    format_xsb,
    load_levels,
    parse_level,
)
from llm_gym.envs.sokoban.ragen_generator import RagenGeneratorConfig, generate_ragen_level
from llm_gym.envs.sokoban.solver import ACTIONS, DELTAS, solve

#: Symbol roles, in RAGEN's cell-code order (0 wall ... 6 player on target).
ROLES: tuple[str, ...] = ("wall", "empty", "target", "box_on_target", "box", "player", "player_on_target")
#: RAGEN's grid symbols.
DEFAULT_VOCAB: dict[str, str] = dict(zip(ROLES, ("#", "_", "O", "√", "X", "P", "S")))
#: RAGEN's "different grid vocabulary" test symbols.
REMAPPED_VOCAB: dict[str, str] = dict(zip(ROLES, ("W", ".", "G", "C", "B", "A", "@")))
_ROLE_TEXT = {
    "wall": "wall",
    "empty": "empty floor",
    "target": "target",
    "box_on_target": "box on a target",
    "box": "box",
    "player": "player",
    "player_on_target": "player on a target",
}
_DELTA = dict(zip(ACTIONS, DELTAS))
#: Largest ``solver_max_states``: bounds the solver's time and memory at reset (about 10 s and 2 GB).
SOLVER_MAX_STATES_LIMIT = 10_000_000


def _resolve_vocab(vocab: str | Mapping[str, str]) -> dict[str, str]:
    if isinstance(vocab, str):
        if vocab in ("default", "ragen"):
            return dict(DEFAULT_VOCAB)
        if vocab == "remapped":
            return dict(REMAPPED_VOCAB)
        raise ValueError(f"vocab must be 'default', 'remapped' or a mapping of {ROLES}, got {vocab!r}")
    if not isinstance(vocab, Mapping) or set(vocab) != set(ROLES):
        raise ValueError(f"a custom vocab must map exactly these roles to symbols: {', '.join(ROLES)}")
    out = {role: vocab[role] for role in ROLES}
    for role, sym in out.items():
        if not isinstance(sym, str) or len(sym) != 1 or sym in "\n\r\t" or not sym.isprintable():
            raise ValueError(f"vocab symbol for {role!r} must be one printable character, got {sym!r}")
    if len(set(out.values())) != len(ROLES):
        raise ValueError(f"vocab symbols must be distinct, got {out}")
    return out


#: ``observation_style`` values: our coordinate text, or RAGEN's exact one.
OBSERVATION_STYLES = ("llmgym", "ragen")

# RAGEN's prompt text for Sokoban, verbatim (RAGEN-2's protocol is defined by it): the instructions and "max
# words" hints (``max_tokens``) of SimpleSokoban and CoordSokoban in RAGEN's ``config/envs.yaml``, and the symbol
# meanings of ``ragen/env/sokoban/config.py`` (in ROLES order).
_RAGEN_TEXT = (
    "You are solving the Sokoban puzzle. \nYou are the player and you need to push all boxes to targets. \n"
    "When you are right next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box. \n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>\n"
)
_RAGEN_COORD_TEXT = (
    "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.\n"
    "You are provided with a symbol grid and the zero-indexed coordinates of the player, each box, and each "
    "target. \nCoordinates range from the top-left corner (0, 0) to the bottom-right corner (5, 5). \n"
    "When you are exactly next to a box, you can push it by moving in the same direction. \n"
    "You cannot push a box through a wall, and you cannot pull a box.\n"
    "The answer should be a sequence of actions, like <answer>Right || Right || Up</answer>.\n"
)
# RAGEN shows its dataclass default legend in every observation format and for every vocabulary: its config merge
# reads ``observation_format`` and ``grid_vocab`` from the top level of the ``custom_envs`` entry, where they are
# absent (they sit under ``env_config``), so it always sees "grid" and the default symbols (ragen/llm_agent/
# ctx_manager.py:126-132). CoordSokoban and SokobanDifferentGridVocab get this legend too.
_RAGEN_LEGEND = "#: wall, _: empty, O: target, √: box on target, X: box, P: player, S: player on target"


def _cells(cells) -> str:
    return ", ".join(f"({r}, {c})" for r, c in sorted(cells)) or "none"


class SokobanEnv(TextEnv):
    """Push every box onto a target in a small warehouse.

    ## Description
    RAGEN's text Sokoban. Levels are generated from the env's seed (a random-walk room, goals, then a backward
    search from the solved position), so each is solvable and ``info["optimal_length"]`` gives its optimal
    solution length in moves. Levels can also come from an XSB file (``level_file``) or be given at reset
    (``options={"level": xsb_text}``).

    ## Action
    ``Up``, ``Down``, ``Left``, ``Right`` (case-insensitive), several per turn separated by ``||``. The player
    moves one cell; walking into a box pushes it when the cell beyond is floor or a target, otherwise nothing
    moves (the move is blocked, still costs a step, and is not *effective*). Boxes cannot be pulled.

    ## Observation
    ``grid`` (default): rows of ``#`` wall, ``_`` empty, ``O`` target, ``X`` box, ``√`` box on target, ``P``
    player, ``S`` player on target. ``vocab="remapped"`` uses ``W . G B C A @`` for the same roles (wall,
    empty, target, box, box on target, player, player on target). ``grid_coord``: a coordinate block (board
    size, targets, boxes, boxes on target, player), then ``Grid Map:`` and the grid. ``observation_style="ragen"``
    writes that block exactly as RAGEN does (``ragen/env/sokoban/utils.py``, ``format_coordinate_render``, and
    ``ragen/env/sokoban/env.py``, ``_render_text``): ``Coordinates: `` and ``Grid Map: `` headers with a trailing
    space, ``Board size: R rows x C cols (zero-indexed).``, and lines with no entries left out.

    ## Starting state
    A level generated from ``np_random`` (or, with ``level_file``, a file level picked by seed or
    ``options={"level_index": i}``; or the level given as ``options={"level": xsb_text_or_SokobanLevel}``),
    never already solved: the player and boxes stand where the level puts them.

    ## Rewards
    ``step`` -0.1 per executed action; ``box_on_target`` +1 when a box is pushed onto a target;
    ``box_off_target`` -1 when one is pushed off; ``solved`` +10 when all boxes are on targets;
    ``format_penalty`` -0.1 per invalid turn. Override with ``rewards={...}``.

    ## Episode end
    Terminated (success) when every box is on a target; truncated after ``max_turns`` turns or ``max_actions``
    executed actions.

    ## Information
    ``reset`` adds ``optimal_length`` (moves; ``None`` if the solver gave up or the level is unsolvable),
    ``solver_status``, ``level`` (XSB text), ``level_source`` (``generated`` / ``file`` / ``options``) and
    ``level_index`` (file levels). Every ``info`` adds ``player`` and ``boxes_on_target``.

    ## Arguments
    * ``dim_room``: room size, default ``(6, 6)``, at most ``(100, 100)`` (a larger room gets an observation
      space that fits it).
    * ``num_boxes``: default 1.
    * ``min_optimal_length``, ``max_optimal_length``: the generated levels' optimal solution lengths, default 2
      and ``None`` (the episode's ``max_actions``, so every generated level can be solved in the budget).
    * ``observation_format``: ``"grid"`` (default) or ``"grid_coord"``.
    * ``observation_style``: ``"llmgym"`` (default) or ``"ragen"`` (RAGEN's exact coordinate text; the
      ``grid`` format is the same in both).
    * ``vocab``: ``"default"``, ``"remapped"`` or a role -> symbol mapping.
    * ``level_file``: ``None`` (generate), ``"sample"`` (the bundled levels) or an XSB path of at most 16 MiB
      and 10,000 levels of at most 100x100.
    * ``solver_max_states``: the solver's state budget for file and given levels at reset and for
      ``generator="ragen"`` levels, default 200,000, at most 10**7.
    * ``generator``: ``None`` (our generator), a :class:`GeneratorConfig` overriding its knobs, or ``"ragen"`` /
      a :class:`RagenGeneratorConfig` (RAGEN's generator, ``ragen/env/sokoban/utils.py``: easier levels, not
      bounded by ``min/max_optimal_length``; its rooms need ``dim_room`` >= 5x5 and
      ``num_boxes`` <= ``min(dim_room) - 2``).
    * ``search_depth``: ``generator="ragen"`` only: RAGEN's reverse-play depth, default 300, at most 1000 (RAGEN
      uses 10 for LargerSokoban and 30 for the new-vocabulary variant).
    * The common ``TextEnv`` arguments (``max_turns`` 5, ``max_actions_per_turn`` 2, ``max_actions`` 10).

    ## Version history
    * v0: initial version.
    """

    game_reward_spec = RewardSpec.of(
        ("step", -0.1, "every executed action (blocked moves included)"),
        ("box_on_target", 1.0, "a box is pushed onto a target"),
        ("box_off_target", -1.0, "a box is pushed off a target"),
        ("solved", 10.0, "the move that puts the last box on a target"),
    )
    action_names = ACTIONS
    expert_name = "bfs-solver"
    data_kwargs = {"level_file": ("sample",)}
    # room size, boxes, generator, search depth, solution lengths and the solver budget scale a reset's work
    light_kwargs = ("observation_format", "observation_style", "vocab")
    reset_options = ("level", "level_index")

    def __init__(
        self,
        *,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        min_optimal_length: int = 2,
        max_optimal_length: int | None = None,
        observation_format: str = "grid",
        observation_style: str = "llmgym",
        vocab: str | Mapping[str, str] = "default",
        level_file: str | None = None,
        solver_max_states: int = 200_000,
        generator: GeneratorConfig | RagenGeneratorConfig | str | None = None,
        search_depth: int | None = None,
        **kwargs: Any,
    ):
        if observation_format not in ("grid", "grid_coord"):
            raise ValueError(f"observation_format must be 'grid' or 'grid_coord', got {observation_format!r}")
        if observation_style not in OBSERVATION_STYLES:
            raise ValueError(
                f"observation_style must be one of {OBSERVATION_STYLES}, got {observation_style!r}"
            )
        if (
            not is_int(solver_max_states, numpy=False)
            or not 0 <= solver_max_states <= SOLVER_MAX_STATES_LIMIT
        ):
            raise ValueError(
                f"solver_max_states must be an integer in [0, {SOLVER_MAX_STATES_LIMIT}], got {solver_max_states!r}"
            )
        self.observation_format = observation_format
        self.observation_style = observation_style
        self.vocab = _resolve_vocab(vocab)
        self.glyphs = "".join(self.vocab.values())
        self.solver_max_states = solver_max_states
        if level_file is not None and not isinstance(level_file, (str, os.PathLike)):
            raise ValueError(f"level_file must be a path (a string) or None, got {type(level_file).__name__}")
        self.level_file = None if level_file is None else str(level_file)
        self.levels: list[SokobanLevel] = load_levels(level_file) if level_file is not None else []
        needed = max((self._obs_bound(lv) for lv in self.levels), default=0)
        self.obs_max_length = max(type(self).obs_max_length, needed)
        super().__init__(**kwargs)
        if search_depth is not None and generator != "ragen":
            raise ValueError("search_depth applies to generator='ragen' only")
        if generator == "ragen":
            if solver_max_states < 1:
                raise ValueError(
                    "generator='ragen' measures every level with the solver: solver_max_states >= 1"
                )
            generator = RagenGeneratorConfig(
                dim_room=dim_room,
                num_boxes=num_boxes,
                search_depth=300 if search_depth is None else search_depth,
                solver_max_states=solver_max_states,  # the env's budget applies to its generated levels too
            )
        elif isinstance(generator, str):
            raise ValueError(f"generator must be None, 'ragen' or a generator config, got {generator!r}")
        if generator is None:
            generator = GeneratorConfig(
                dim_room=dim_room,
                num_boxes=num_boxes,
                min_optimal_length=min_optimal_length,
                max_optimal_length=self.max_actions if max_optimal_length is None else max_optimal_length,
            )
        elif not isinstance(generator, (GeneratorConfig, RagenGeneratorConfig)):
            raise ValueError(
                f"generator must be a GeneratorConfig or RagenGeneratorConfig, got {type(generator).__name__}"
            )
        self.generator = generator
        rows, cols = generator.dim_room
        if max(rows, cols) > LEVEL_MAX_SIDE:
            # Generation time grows with the room (a 3000x3000 room hung for minutes); 100x100 takes ~2 s.
            raise ValueError(
                f"dim_room may be at most {LEVEL_MAX_SIDE}x{LEVEL_MAX_SIDE}, got {generator.dim_room}"
            )
        needed = self._size_bound(rows, cols, generator.num_boxes)
        if needed > self.obs_max_length:
            # Rooms larger than the default space get a space that fits them (checked again at every reset).
            self.obs_max_length = needed
            self.observation_space = self._make_observation_space()
        self._solutions: dict[int, tuple[str, int | None]] = {}
        self._level: SokobanLevel | None = None
        self._boxes: set[Cell] = set()
        self._player: Cell = (0, 0)
        self._obs: str | None = None

    # ------------------------------------------------------------------------------------- public state
    @property
    def level(self) -> SokobanLevel | None:
        """The level as it was at reset (``None`` before the first reset)."""
        return self._level

    @property
    def walls(self) -> frozenset[Cell]:
        return self._level.walls if self._level else frozenset()

    @property
    def targets(self) -> frozenset[Cell]:
        return self._level.goals if self._level else frozenset()

    @property
    def boxes(self) -> frozenset[Cell]:
        return frozenset(self._boxes)

    @property
    def player(self) -> Cell:
        return self._player

    def current_level(self) -> SokobanLevel:
        """The current position as a :class:`SokobanLevel` (e.g. for :func:`solve`)."""
        if self._level is None:
            raise ValueError("call reset() first")
        return self._level.with_state(self._boxes, self._player)

    def board(self) -> list[str]:
        """The current position as XSB rows (``#`` wall, `` `` floor, ``.`` goal, ``$`` box, ``*`` box on goal,
        ``@`` player, ``+`` player on goal)."""
        if self._level is None:
            return []
        return format_xsb(self.current_level()).split("\n")

    # ------------------------------------------------------------------------------------------- hooks
    def _rules(self) -> str:
        v = self.vocab
        legend = ", ".join(f"{v[role]} {_ROLE_TEXT[role]}" for role in ROLES)
        coords = (
            " Coordinates are (row, column), zero-indexed from the top-left corner."
            if self.observation_format == "grid_coord"
            else ""
        )
        return (
            "You are solving the Sokoban puzzle. You are the player; push every box onto a target. "
            "Moving into a box pushes it one cell if the cell beyond is empty floor or a target; you cannot "
            "pull boxes, and a box cannot be pushed into a wall or another box.\n"
            f"Symbols: {legend}.{coords}\n"
            f"Rewards: {self.reward_spec['step']:g} per move, {self.reward_spec['box_on_target']:+g} for a box "
            f"pushed onto a target, {self.reward_spec['box_off_target']:+g} for a box pushed off one, "
            f"{self.reward_spec['solved']:+g} when all boxes are on targets."
        )

    def _reset_game(self, options: dict[str, Any]) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if "level" in options:
            level = options["level"]
            if isinstance(level, str):
                level = parse_level(level, source="options['level']")
            elif not isinstance(level, SokobanLevel):
                raise ValueError(
                    f"options['level'] must be XSB text or a SokobanLevel, got {type(level).__name__}"
                )
            status, length = self._solve(level)
            info["level_source"] = "options"
        elif self.levels:
            index = options.get("level_index")
            if index is None:
                index = int(self.np_random.integers(len(self.levels)))
            elif not is_int(index) or not 0 <= index < len(self.levels):
                raise ValueError(f"level_index must be an integer in [0, {len(self.levels)}), got {index!r}")
            index = int(index)
            level = self.levels[index]
            if index not in self._solutions:
                self._solutions[index] = self._solve(level)
            status, length = self._solutions[index]
            info["level_source"] = "file"
            info["level_index"] = index
        else:
            if "level_index" in options:
                raise ValueError("options['level_index'] needs a file-backed env (level_file=...)")
            if isinstance(self.generator, RagenGeneratorConfig):
                generated = generate_ragen_level(self.np_random, self.generator)
            else:
                generated = generate_level(self.np_random, self.generator)
            level, status, length = generated.level, "solved", generated.optimal_length
            info["level_source"] = "generated"
        if level.is_solved:
            raise ValueError("the level is already solved (every box is on a goal)")
        if self._obs_bound(level) > self.obs_max_length:
            raise ValueError(
                f"the level ({level.height}x{level.width}, {level.num_boxes} boxes) is too large for this env's "
                f"observation space ({self.obs_max_length} characters)"
            )
        self._level = level
        self._boxes = set(level.boxes)
        self._player = level.player
        self._obs = None
        info.update(optimal_length=length, solver_status=status, level=format_xsb(level))
        return info

    def _solve(self, level: SokobanLevel) -> tuple[str, int | None]:
        result = solve(level, max_states=self.solver_max_states)
        return result.status, result.length

    def _apply_action(self, action: str) -> tuple[dict[str, float], bool]:
        spec = self.reward_spec
        level = self._level
        assert level is not None  # set by reset
        goals = level.goals
        before = len(self._boxes & goals)
        dr, dc = _DELTA[action]
        r, c = self._player
        nxt = (r + dr, c + dc)
        moved = False
        if nxt not in level.walls:
            if nxt in self._boxes:
                beyond = (r + 2 * dr, c + 2 * dc)
                if beyond not in level.walls and beyond not in self._boxes:
                    self._boxes.remove(nxt)
                    self._boxes.add(beyond)
                    self._player, moved = nxt, True
            else:
                self._player, moved = nxt, True
        self._obs = None
        after = len(self._boxes & goals)
        parts = {"step": spec["step"]}
        if after > before:
            parts["box_on_target"] = spec["box_on_target"] * (after - before)
        elif after < before:
            parts["box_off_target"] = spec["box_off_target"] * (before - after)
        if after == len(goals) and before < after:
            parts["solved"] = spec["solved"]
        return parts, moved

    def _is_terminated(self) -> bool:
        return self._level is not None and self._boxes == self._level.goals

    def _is_success(self) -> bool:
        return self._is_terminated()

    def _extra_info(self) -> dict[str, Any]:
        goals = self._level.goals if self._level else frozenset()
        return {"player": self._player, "boxes_on_target": len(self._boxes & goals)}

    # ------------------------------------------------------------------------------- family knowledge
    def optimum_solves(self, info: Mapping[str, Any]) -> bool | None:
        if info.get("solver_status") != "solved":
            return None
        return self.within_limits(info.get("optimal_length"))

    def expert_move(self) -> ExpertMove | None:
        """The breadth-first solver's optimal plan (fewest moves) from here, ``max_actions_per_turn`` moves per
        turn; ``None`` when the solver finds no plan within its state budget or the plan does not fit the
        actions left."""
        result = solve(self.current_level(), max_states=self.solver_max_states or 200_000)
        if not result.solved or len(result.plan) > self.actions_left:
            return None
        chunk = result.plan[: self.max_actions_per_turn]
        think = (
            f"The shortest solution from here takes {len(result.plan)} moves: {', '.join(result.plan)}. "
            f"Next: {', '.join(chunk)}."
        )
        return ExpertMove(think, chunk)

    def ragen_prompt(self) -> RagenPrompt | None:
        if self.observation_format == "grid":
            return RagenPrompt(_RAGEN_TEXT, _RAGEN_LEGEND, 100)
        return RagenPrompt(_RAGEN_COORD_TEXT, _RAGEN_LEGEND, 120)

    # ------------------------------------------------------------------------------------- observation
    def _grid(self) -> str:
        level, v = self._level, self.vocab
        assert level is not None  # set by reset
        grid = [[v["empty"]] * level.width for _ in range(level.height)]
        for r, c in level.walls:
            grid[r][c] = v["wall"]
        for r, c in level.goals:
            grid[r][c] = v["target"]
        for r, c in self._boxes:
            grid[r][c] = v["box_on_target"] if (r, c) in level.goals else v["box"]
        pr, pc = self._player
        grid[pr][pc] = v["player_on_target"] if self._player in level.goals else v["player"]
        return "\n".join("".join(row) for row in grid)

    def _coords(self) -> str:
        level = self._level
        assert level is not None  # set by reset
        goals = level.goals
        on = self._player in goals
        return (
            f"Coordinates:\nBoard: {level.height} rows x {level.width} cols (zero-indexed, (row, col))\n"
            f"Targets: {_cells(goals)}\nBoxes: {_cells(self._boxes - goals)}\n"
            f"Boxes on target: {_cells(self._boxes & goals)}\n"
            f"{'Player on target' if on else 'Player'}: ({self._player[0]}, {self._player[1]})"
        )

    def _ragen_coords(self) -> str:
        # RAGEN's format_coordinate_render: walls are not listed, empty categories are left out, cells row-major.
        level, boxes = self._level, self._boxes
        assert level is not None  # set by reset
        goals = level.goals
        player = "Player on target" if self._player in goals else "Player"
        lines = [f"Board size: {level.height} rows x {level.width} cols (zero-indexed)."]
        for label, cells in (
            ("Targets", goals),
            ("Boxes", boxes - goals),
            ("Boxes on target", boxes & goals),
            (player, {self._player}),
        ):
            if cells:
                lines.append(f"{label}: {_cells(cells)}")
        return "\n".join(lines)

    def _observation(self) -> str:
        if self._level is None:
            return ""
        if self._obs is None:
            grid = self._grid()
            if self.observation_format == "grid":
                self._obs = grid
            elif self.observation_style == "ragen":
                self._obs = f"Coordinates: \n{self._ragen_coords()}\nGrid Map: \n{grid}"
            else:
                self._obs = f"{self._coords()}\nGrid Map:\n{grid}"
        return self._obs

    def _obs_bound(self, level: SokobanLevel) -> int:
        """An upper bound on the observation length for ``level`` in this env's format."""
        return self._size_bound(level.height, level.width, len(level.goals))

    def _size_bound(self, rows: int, cols: int, goals: int) -> int:
        grid = rows * (cols + 1)
        if self.observation_format == "grid":
            return grid
        return grid + 200 + 16 * (2 * goals + 1)
