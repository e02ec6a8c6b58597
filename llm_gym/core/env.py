"""``TextEnv``: the base class every llm-gym environment derives from.

Subclasses implement the game through a handful of hooks (``_reset_game``, ``_apply_action``, ``_observation``,
``_is_terminated``, ``_is_success``, ``_rules``); the base class owns parsing, the turn and action limits, the
format penalty, the ``info`` contract and rendering. A family also answers, through the public methods under
"Family knowledge" below, what the rest of llm-gym asks of it (a random valid answer, the optimum, an expert
move, RAGEN's prompt text), so that nothing outside its package needs to know which family it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from llm_gym.core.checks import is_int
from llm_gym.core.parsing import (
    ACTION_SEP,
    ParsedResponse,
    format_response,
    parse_ragen_response,
    parse_response,
)
from llm_gym.core.rewards import FORMAT_PENALTY, RewardSpec
from llm_gym.core.spaces import AnyText, text_space

#: Longest action string covered by ``action_space`` (``step`` accepts longer text too).
ACTION_MAX_LENGTH = 16384
#: ``parse_mode`` values: llm-gym's tolerant parser, or RAGEN's strict pattern with valid-subset execution.
PARSE_MODES = ("llmgym", "ragen")
#: Largest ``dynamics_seed`` reset option.
DYNAMICS_SEED_MAX = 2**63 - 1


def _positive_int(name: str, value: Any) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def fits_limits(length: int | None, max_turns: int, max_actions_per_turn: int, max_actions: int) -> bool:
    """Whether a plan of ``length`` actions fits the episode's action budget and turn limit (``None``: no plan)."""
    if length is None:
        return False
    return length <= max_actions and -(-length // max_actions_per_turn) <= max_turns


@dataclass(frozen=True)
class ExpertMove:
    """One turn of a family's expert (:meth:`TextEnv.expert_move`): the reasoning shown inside ``<think>`` and the
    answer parts (action names, or the one free-text answer)."""

    think: str
    parts: Sequence[str]


@dataclass(frozen=True)
class RagenPrompt:
    """RAGEN's own prompt text for an env (:meth:`TextEnv.ragen_prompt`), used by ``ChatFormat(style="ragen")``.

    Attributes:
        instruction: RAGEN's per-env instruction, verbatim (``config/envs.yaml`` in RAGEN).
        legend: the symbol meanings shown after it (``None``: no legend, as for RAGEN's answer-only envs).
        max_tokens: the "Max response length: N words (tokens)" hint of every turn.
    """

    instruction: str
    legend: str | None
    max_tokens: int


def check_answer_sep(value: Any) -> str | None:
    """An answer environment's ``action_sep`` argument: ``None`` (default: the whole answer is the one action) or a
    non-empty separator such as ``"||"`` (the answer is split on it and only its first part is graded, as RAGEN runs
    the first of an answer's actions when the episode allows one, ``ragen/llm_agent/es_manager.py:231-232``)."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"action_sep must be None or a non-empty string such as '||', got {value!r:.40}")
    return value


class TextEnv(gym.Env[str, str]):
    """Base class for multi-turn text environments driven by raw LLM responses.

    Each ``step`` takes the model's whole response, parses it (``<think>..</think><answer>a1 || a2</answer>``),
    executes the actions in order, and returns the new state as text. A turn whose response is unparsable or
    names an invalid action executes nothing, keeps the game state, and costs ``format_penalty``.

    Common arguments:
        render_mode: ``"ansi"``, ``"rgb_array"`` or ``"human"``.
        rewards: overrides of reward component values, e.g. ``{"format_penalty": 0.0}``.
        max_turns: responses per episode; the episode is truncated after this many.
        max_actions_per_turn: actions kept from one response (extra ones are dropped and counted in ``info``).
        max_actions: actions executed per episode; the episode is truncated when they are used up.
        think: require a ``<think>`` block before the answer (``False``: answer-only mode).
        parse_mode: ``"llmgym"`` (default): tags matched case-insensitively with chatter allowed, and a turn
            naming any invalid action executes nothing. ``"ragen"``: RAGEN's parsing
            (:func:`~llm_gym.core.parsing.parse_ragen_response`: case-sensitive tags, only whitespace between
            ``</think>`` and ``<answer>``) and RAGEN's execution (``ragen/llm_agent/es_manager.py``): the valid
            actions of the answer run, the invalid ones are skipped, and the turn costs ``format_penalty`` if
            any was invalid.

    Reset options understood by every env: ``dynamics_seed`` (a non-negative integer). The start state is still
    drawn from ``seed``; afterwards ``np_random`` is reseeded from ``(seed, dynamics_seed)``, so rollouts that
    share ``seed`` start identically but draw their own transitions (FrozenLake slips, Bandit payouts), as
    RAGEN's group members do. The same ``seed`` and ``options`` still give the same episode.

    Family knowledge: what the rest of llm-gym asks of an env goes through these methods, which a family
    overrides in its own package (``agent/``, ``trainer/`` and the baselines never look at an env's class):

    * :meth:`sample_valid_action`: a random well-formed answer (the random valid-action baseline). Default:
      uniform picks from ``action_names`` (override ``_random_answer`` for state-dependent answers); free-text
      envs without ``action_names`` raise ``NotImplementedError`` ("a random answer is meaningless").
    * :meth:`optimum_solves`: whether a perfect player solves the episode just reset. Default ``None`` (unknown).
    * :meth:`expert_move` with :attr:`expert_name`: the expert policy behind ``llmgym export``. Default: no
      expert (``expert_name`` is ``None``; ``expert_move`` raises ``NotImplementedError``).
    * :meth:`ragen_prompt`: RAGEN's own instruction and symbol legend for ``ChatFormat(style="ragen")``.
      Default ``None``: the chat shows :attr:`instructions` in RAGEN's layout.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi", "rgb_array", "human"], "render_fps": 4}

    #: Game reward components; ``format_penalty`` is added by the base class.
    game_reward_spec: ClassVar[RewardSpec] = RewardSpec(())
    #: Discrete action vocabulary, matched case-insensitively; ``None`` for free-text answer environments.
    action_names: ClassVar[tuple[str, ...] | None] = None
    #: Separator between actions in one answer; ``None`` treats the whole answer as one action. Answer environments
    #: take it as an argument (:func:`check_answer_sep`), so it may differ per instance.
    action_sep: str | None = ACTION_SEP
    #: Glyphs the observations may contain beyond printable ASCII and ``√``.
    glyphs: str = ""  # a class default; a family may set its own per instance (e.g. per level set)
    #: Upper bound on observation length, in characters.
    obs_max_length: int = 4096
    #: Answer environments set this: using up ``max_turns`` is a game rule ("no answers left"), so the episode
    #: ends ``terminated`` rather than ``truncated`` (Gymnasium reserves truncation for time limits).
    turn_limit_terminates: ClassVar[bool] = False
    #: Name of the family's expert policy (:meth:`expert_move`), stored in every exported row; ``None``: no expert.
    expert_name: ClassVar[str | None] = None
    #: Constructor arguments that name a file or a hub data set, each with the values that name data bundled with
    #: llm-gym (MetaMathQA: ``{"dataset": ("sample",)}``). A replayed record and an ``llmgym serve`` client may ask
    #: only for those values or the id's own default; any other data is the user's or the server operator's.
    data_kwargs: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: Constructor arguments that do not change how much work or memory a reset or step takes (turn and action
    #: limits, reward values, presentation, answer rules): an ``llmgym serve`` client may set these. Every other
    #: argument (how levels are generated, their size, solver budgets, data) stays the server operator's. A class
    #: lists only its own; its bases' count too (:func:`llm_gym.core.kwargs.light_kwargs`).
    light_kwargs: ClassVar[tuple[str, ...]] = (
        "rewards",
        "max_turns",
        "max_actions_per_turn",
        "max_actions",
        "think",
        "parse_mode",
    )
    #: Keys of ``reset(options=...)`` the env understands (a class lists its own; its bases' count too).
    #: ``llmgym serve`` refuses any other key, so a misspelt option is an error, not an ignored one.
    reset_options: ClassVar[tuple[str, ...]] = ("dynamics_seed",)

    def __init__(
        self,
        *,
        render_mode: str | None = None,
        rewards: Mapping[str, float] | None = None,
        max_turns: int = 5,
        max_actions_per_turn: int = 2,
        max_actions: int = 10,
        think: bool = True,
        parse_mode: str = "llmgym",
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.reward_spec: RewardSpec = self.default_reward_spec().with_overrides(rewards)
        self.max_turns = _positive_int("max_turns", max_turns)
        self.max_actions_per_turn = _positive_int("max_actions_per_turn", max_actions_per_turn)
        self.max_actions = _positive_int("max_actions", max_actions)
        if not isinstance(think, (bool, np.bool_)):
            # bool("false") is True: a string from a config or record must not silently mean "on".
            raise ValueError(f"think must be True or False, got {think!r}")
        self.think = bool(think)
        if parse_mode not in PARSE_MODES:
            raise ValueError(f"parse_mode must be one of {PARSE_MODES}, got {parse_mode!r}")
        self.parse_mode = parse_mode
        self._reset_seed: int | None = None
        self.observation_space = self._make_observation_space()
        self.action_space = AnyText(ACTION_MAX_LENGTH)
        self._lookup = {n.lower(): n for n in self.action_names} if self.action_names else {}
        self._turn = 0
        self._actions_used = 0
        self._episode_over = False
        self._ended = (False, False)
        self._has_reset = False
        self._window: Any = None  # the human-mode window (llm_gym.render), opened on the first frame

    # ----------------------------------------------------------------------------------------------- API
    @classmethod
    def default_reward_spec(cls) -> RewardSpec:
        """The reward components and their default values for this environment class."""
        return cls.game_reward_spec.extend([FORMAT_PENALTY])

    @property
    def rules(self) -> str:
        """The game rules and symbol legend alone, without the action list and answer format (front ends
        that act through tool calls, such as :mod:`llm_gym.integrations.trl`, describe those themselves)."""
        return self._rules().strip()

    @property
    def instructions(self) -> str:
        """Everything an LLM needs to play: rules, symbols, actions and the answer format."""
        lines = [self._rules().strip()]
        if self.action_names:
            lines.append(f"Valid actions: {', '.join(self.action_names)}.")
        if self.action_sep and self.max_actions_per_turn > 1:
            lines.append(
                f"You may give up to {self.max_actions_per_turn} actions per turn, separated by "
                f"'{self.action_sep.strip()}', and up to {self.max_actions} in the whole episode."
            )
        example = self.example_response()
        if self.think:
            lines.append(
                "Answer in the format <think>your reasoning</think><answer>your answer</answer>, "
                f"for example: {example}"
            )
        else:
            lines.append(f"Answer in the format <answer>your answer</answer>, for example: {example}")
        return "\n".join(line for line in lines if line)

    def example_response(self) -> str:
        """A well-formed response, used in instructions."""
        if self.action_names:
            acts = list(self.action_names[: min(2, self.max_actions_per_turn)])
        else:
            acts = ["..."]
        return format_response(acts, "...", use_think=self.think, sep=self.action_sep or ACTION_SEP)

    # -------------------------------------------------------------------------------- family knowledge
    def sample_valid_action(
        self,
        rng: np.random.Generator | None = None,
        *,
        actions_per_turn: int | None = None,
        reasoning: str = "random",
    ) -> str:
        """A random well-formed response for the current state: what the random valid-action policy answers.

        Args:
            rng: the generator to draw from (default: a fresh one); ``np_random`` is never touched, so asking
                does not change the episode.
            actions_per_turn: how many actions to name, in ``[1, max_actions_per_turn]`` (default: a random
                count in that range); one-answer envs ignore it.
            reasoning: the text inside ``<think>`` (when the env has ``think=True``).

        Raises:
            NotImplementedError: the env takes free-text answers, for which a random answer is meaningless.
            ValueError: ``actions_per_turn`` is out of range, or the valid answers depend on a state that
                ``reset`` has not set up yet.
        """
        rng = rng if rng is not None else np.random.default_rng()
        if actions_per_turn is None:
            actions_per_turn = int(rng.integers(1, self.max_actions_per_turn + 1))
        parts = self._random_answer(rng, int(actions_per_turn))
        return format_response(parts, reasoning, use_think=self.think, sep=self.action_sep or ACTION_SEP)

    def optimum_solves(self, info: Mapping[str, Any]) -> bool | None:
        """Whether a perfect player solves the episode just reset (``info``: what ``reset`` returned) within this
        env's turn and action limits; ``None`` (the default) when no exact optimum is known."""
        return None

    def within_limits(self, length: int | None) -> bool:
        """Whether a plan of ``length`` actions fits this env's action budget and turn limit (``None``: no plan)."""
        return fits_limits(length, self.max_turns, self.max_actions_per_turn, self.max_actions)

    def expert_move(self) -> ExpertMove | None:
        """The family's expert for the current state: the next turn's answer, re-planned from here, or ``None``
        when the expert cannot solve the episode from here (``llmgym export`` then skips the seed). Families with
        an expert override it and set :attr:`expert_name`; the default raises ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} has no expert policy")

    def expert_reply(self) -> str | None:
        """:meth:`expert_move` as the reply text a model would give (this env's think flag and action separator),
        or ``None`` when the expert has no plan from here; ``ValueError`` for a family without an expert."""
        if not self.expert_name:
            raise ValueError(
                f"no expert for {type(self).__name__}: it needs a family that implements "
                "TextEnv.expert_move and sets expert_name"
            )
        move = self.expert_move()
        if move is None:
            return None
        return format_response(
            move.parts, move.think, use_think=self.think, sep=self.action_sep or ACTION_SEP
        )

    def ragen_prompt(self) -> RagenPrompt | None:
        """RAGEN's own instruction, symbol legend and length hint for this env (``ChatFormat(style="ragen")``),
        or ``None`` (the default): RAGEN has no text of its own for it, and the chat shows :attr:`instructions`."""
        return None

    @property
    def turn(self) -> int:
        """Responses consumed in the current episode."""
        return self._turn

    @property
    def actions_left(self) -> int:
        return max(0, self.max_actions - self._actions_used)

    @property
    def turns_left(self) -> int:
        return max(0, self.max_turns - self._turn)

    @property
    def reset_seed(self) -> int | None:
        """The ``seed`` passed to the latest ``reset`` (``None`` when it continued the previous stream)."""
        return self._reset_seed

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        # Options are checked before anything changes: a refused reset leaves the env (and its random stream)
        # as it was.
        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"options must be a dict or None, got {type(options).__name__}")
        options = dict(options or {})
        dynamics_seed = options.pop("dynamics_seed", None)
        if dynamics_seed is not None and (
            not is_int(dynamics_seed) or not 0 <= dynamics_seed <= DYNAMICS_SEED_MAX
        ):
            raise ValueError(
                f"options['dynamics_seed'] must be an integer in [0, 2**63), got {dynamics_seed!r:.40}"
            )
        super().reset(seed=seed)
        self._reset_seed = None if seed is None else int(seed)
        self._turn = 0
        self._actions_used = 0
        self._episode_over = False
        self._ended = (False, False)
        # Until the game is set up: a reset that fails in _reset_game (a bad level, an unreachable target) leaves
        # an env that refuses step() with ResetNeeded instead of playing a half-reset episode.
        self._has_reset = False
        extra = self._reset_game(options) or {}
        if dynamics_seed is not None:
            # The start state above came from ``seed``; transitions get their own stream. Without a seed the
            # base is drawn from the current stream, so the result is still a function of the env's history.
            base = int(seed) if seed is not None else int(self.np_random.integers(DYNAMICS_SEED_MAX))
            self.np_random = np.random.default_rng([base, int(dynamics_seed)])
        self._has_reset = True
        info = self._info(valid=True, effective=False, executed=[], components=self.reward_spec.zeros())
        info.update(extra)
        if dynamics_seed is not None:
            info["dynamics_seed"] = int(dynamics_seed)
        if self.render_mode == "human":
            self.render()
        return self._observation(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if not self._has_reset:
            raise gym.error.ResetNeeded("call reset() before step()")
        components = self.reward_spec.zeros()
        if self._episode_over:
            info = self._info(valid=False, effective=False, executed=[], components=components)
            info["error"] = "the episode is over; call reset()"
            return self._observation(), 0.0, self._ended[0], self._ended[1], info
        self._turn += 1
        parse = parse_ragen_response if self.parse_mode == "ragen" else parse_response
        parsed = parse(action, think=self.think, max_actions=self.max_actions_per_turn, sep=self.action_sep)
        executed: list[str] = []
        effective = False
        error = parsed.error
        if error is None:
            if self.parse_mode == "ragen" and self.action_names:
                actions, error = self._valid_subset(parsed)
            else:
                actions, error = self._parse_actions(parsed)
                actions = actions if error is None else []
            if actions:
                budget = self.max_actions - self._actions_used
                for act in actions[:budget]:
                    parts, moved = self._apply_action(act)
                    for name, value in parts.items():
                        components[name] += value
                    executed.append(str(act))
                    effective = effective or moved
                    if self._is_terminated():
                        break
                self._actions_used += len(executed)
        valid = error is None
        if not valid:
            components["format_penalty"] += self.reward_spec["format_penalty"]
        reward = float(sum(components.values()))
        out_of_turns = self._turn >= self.max_turns
        terminated = bool(self._is_terminated()) or (self.turn_limit_terminates and out_of_turns)
        truncated = (not terminated) and (out_of_turns or self._actions_used >= self.max_actions)
        self._episode_over = terminated or truncated
        self._ended = (terminated, truncated)
        info = self._info(valid=valid, effective=effective, executed=executed, components=components)
        info["error"] = error
        info["dropped_actions"] = parsed.dropped
        if self.render_mode == "human":
            self.render()
        return self._observation(), reward, terminated, truncated, info

    def render(self):
        if self.render_mode is None:
            gym.logger.warn(
                "render() called without a render_mode; pass render_mode='ansi', 'rgb_array' or 'human' to make()"
            )
            return None
        if self.render_mode == "ansi":
            return self._observation()
        from llm_gym.render import render_frame, show_frame

        frame = render_frame(self)
        if self.render_mode == "rgb_array":
            return frame
        self._window = show_frame(frame, self._window, fps=self.metadata.get("render_fps", 4))
        return None

    def close(self):
        if self._window is not None:
            self._window.close()
            self._window = None

    # ------------------------------------------------------------------------------------------- hooks
    def _make_observation_space(self) -> gym.Space:
        return text_space(self.obs_max_length, self.glyphs)

    def _rules(self) -> str:
        """The game rules and symbol legend (without the action format, which the base class adds)."""
        raise NotImplementedError

    def _reset_game(self, options: dict[str, Any]) -> dict[str, Any] | None:
        """Build a new game from ``self.np_random`` (and ``options``); return extra ``info`` keys."""
        raise NotImplementedError

    def _parse_actions(self, parsed: ParsedResponse) -> tuple[list[Any], str | None]:
        """Map answer parts to game actions; return ``(actions, None)`` or ``([], reason)``."""
        if not self.action_names:
            # answer envs take one action per turn: with a separator that is the answer's first part
            return ([parsed.answer] if self.action_sep is None else list(parsed.actions)), None
        actions = []
        for part in parsed.actions:
            name = self._lookup.get(part.lower())
            if name is None:
                shown = part if len(part) <= 40 else part[:37] + "..."
                return [], f"invalid action {shown!r}; valid actions: {', '.join(self.action_names)}"
            actions.append(name)
        return actions, None

    def _valid_subset(self, parsed: ParsedResponse) -> tuple[list[Any], str | None]:
        """RAGEN's execution rule: the answer parts that name an action (case-insensitively), in order, and an
        error naming the others (``ragen/llm_agent/es_manager.py``, ``_extract_map_valid_actions``)."""
        actions, invalid = [], []
        for part in parsed.actions:
            name = self._lookup.get(part.lower())
            if name is None:
                invalid.append(part if len(part) <= 40 else part[:37] + "...")
            else:
                actions.append(name)
        if not invalid:
            return actions, None
        shown = ", ".join(repr(p) for p in invalid[:4])
        valid = ", ".join(self.action_names or ())  # set: step() calls this only for envs with action names
        return actions, f"invalid actions skipped: {shown}; valid actions: {valid}"

    def _random_answer(self, rng: np.random.Generator, actions_per_turn: int) -> list[str]:
        """The answer parts of a random valid answer (:meth:`sample_valid_action`): ``actions_per_turn`` uniform
        picks from ``action_names``. Override for answers that depend on the state (a shown arm, a puzzle's
        numbers); free-text envs keep this default, which raises ``NotImplementedError``."""
        if not self.action_names:
            raise NotImplementedError(
                f"{type(self).__name__} takes free-text answers; a random answer is meaningless"
            )
        limit = self.max_actions_per_turn
        if not 1 <= actions_per_turn <= limit:
            raise ValueError(
                f"actions_per_turn must be in [1, {limit}] (the env's per-turn limit), got {actions_per_turn}"
            )
        picks = rng.integers(0, len(self.action_names), size=actions_per_turn)
        return [self.action_names[int(i)] for i in picks]

    def _apply_action(self, action: Any) -> tuple[dict[str, float], bool]:
        """Execute one action; return its reward components and whether it changed the state."""
        raise NotImplementedError

    def _observation(self) -> str:
        raise NotImplementedError

    def _is_terminated(self) -> bool:
        raise NotImplementedError

    def _is_success(self) -> bool:
        raise NotImplementedError

    def _extra_info(self) -> dict[str, Any]:
        """Game-specific ``info`` keys added on every reset and step (must be deterministic)."""
        return {}

    # --------------------------------------------------------------------------------------- internals
    def _info(self, *, valid: bool, effective: bool, executed: list[str], components: dict) -> dict:
        # Callers pass fresh ``executed`` / ``components`` objects, so no copies (this is on the step hot path).
        info = {
            "success": bool(self._is_success()),
            "action_is_valid": bool(valid),
            "action_is_effective": bool(effective),
            "actions": executed,
            "reward_components": components,
            "turn": self._turn,
            "actions_left": max(0, self.max_actions - self._actions_used),
            "error": None,
            "dropped_actions": 0,
        }
        info.update(self._extra_info())
        return info
