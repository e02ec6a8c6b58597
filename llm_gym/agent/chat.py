"""Chat formatting: turn an environment episode into the messages an LLM sees.

Layout (RAGEN-2 style): the system message is a short assistant sentence followed by ``env.instructions``; every
turn is one user message with the state, the budget left and the answer format, and the model's reply is the
assistant message that follows. Optional extras: the previous turn's reward, a warning when the previous answer
was invalid (using ``info["error"]``), and a window that keeps only the last ``k`` turns.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from llm_gym.core.checks import is_int
from llm_gym.registration import REMOTE_ID, make_env

DEFAULT_SYSTEM_PROMPT = "You're a helpful assistant."
#: ``ChatFormat.style`` values.
CHAT_STYLES = ("llmgym", "ragen")
#: ``ChatFormat.demonstration`` values: what the demonstration of ``one_shot`` answers (see
#: :mod:`llm_gym.agent.demonstrations`).
DEMONSTRATIONS = ("action", "solver", "several", "placeholder")

# RAGEN's turn text, reproduced verbatim because RAGEN-2's protocol is defined by it, assembled as in
# ``ragen/llm_agent/ctx_manager.py`` (``_init_prefix_lookup``, ``_build_system_content``,
# ``_build_turn_state_content``, ``_build_infer_multi_turn_messages``). The per-env instruction, symbol legend and
# "max words" hint come from the env (``TextEnv.ragen_prompt``); envs without them get RAGEN's layout with
# ``env.instructions`` and this hint.
_RAGEN_DEFAULT_MAX_TOKENS = 100
_RAGEN_FORMAT = "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
_RAGEN_FORMAT_NO_THINK = "<answer> [your answer] </answer>"
_RAGEN_WARNING = (
    "No valid action provided previously. Environment state remains the same. Please try again.\n"
)


@dataclass(frozen=True)
class ChatFormat:
    """How episodes are shown to the model.

    Attributes:
        system_prompt: sentence opening the system message; ``env.instructions`` follows it.
        include_instructions: append ``env.instructions`` to the system message.
        history_window: keep only the last ``k`` turns in the context (``None`` = full history).
        reward_feedback: show the previous turn's reward at the top of each turn.
        show_budget: show the actions and turns left in each turn.
        max_response_tokens: when set, the turn text asks the model to stay under this many tokens.
        one_shot: put a demonstration (an example state and a well-formed answer) after the system message; small
            models (e.g. SmolLM2-135M) rarely follow the answer format without it.
        demonstration: what the demonstration answers (``one_shot`` only): ``action``, the env's example answer
            (a fixed legal action such as ``Left``, the same for every state: a constant policy a model can copy);
            ``solver``, the solver's move for the demonstration's own state; ``several``, three example states
            with the solver's moves, all different; ``placeholder``, an answer that is no legal action
            (``ActionName``). Measured in ``docs/learning-study.md``.
        style: ``"llmgym"`` (default, the fields above) or ``"ragen"``: RAGEN's exact text for the envs that
            have it (``TextEnv.ragen_prompt``: Sokoban, FrozenLake, Countdown and MetaMathQA; system: its
            instruction, then the symbol legend and action list where RAGEN has them; each turn: state, actions left,
            format and length hint; from turn 2 on, the user message opens with ``Reward:`` and the previous
            turn's game reward, format penalty excluded), and :attr:`generation_prefix` ``"<think>"``. The other
            fields are ignored in that style; other envs get RAGEN's layout with ``env.instructions``.
    """

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    include_instructions: bool = True
    history_window: int | None = None
    reward_feedback: bool = False
    show_budget: bool = True
    max_response_tokens: int | None = None
    one_shot: bool = False
    style: str = "llmgym"
    demonstration: str = "action"

    @property
    def generation_prefix(self) -> str:
        """Text appended after the chat template's generation prompt (RAGEN style: ``<think>``, so the model
        continues its reasoning; ``ragen/llm_agent/ctx_manager.py``, ``_build_infer_samples``). For an env with
        ``think=False`` RAGEN appends ``<answer>`` instead: use :attr:`Conversation.generation_prefix`."""
        return "<think>" if self.style == "ragen" else ""

    def __post_init__(self) -> None:
        if self.style not in CHAT_STYLES:
            raise ValueError(f"style must be one of {CHAT_STYLES}, got {self.style!r}")
        if self.demonstration not in DEMONSTRATIONS:
            raise ValueError(f"demonstration must be one of {DEMONSTRATIONS}, got {self.demonstration!r}")
        if self.history_window is not None and (
            not is_int(self.history_window, numpy=False) or self.history_window < 1
        ):
            raise ValueError(
                f"history_window must be a positive integer or None, got {self.history_window!r}"
            )
        if self.max_response_tokens is not None and self.max_response_tokens < 1:
            raise ValueError(
                f"max_response_tokens must be positive or None, got {self.max_response_tokens!r}"
            )


#: The :class:`ChatFormat` fields a trained model's chat is rebuilt from, under ``llmgym-train``'s config names
#: (what ``llmgym_run.json`` and exported rows keep): config name -> ``ChatFormat`` field.
CHAT_SETTINGS = {
    "chat_style": "style",
    "system_prompt": "system_prompt",
    "include_instructions": "include_instructions",
    "reward_feedback": "reward_feedback",
    "one_shot_example": "one_shot",
    "demonstration": "demonstration",
}


def chat_settings(fmt: ChatFormat) -> dict[str, Any]:
    """``fmt``'s :data:`CHAT_SETTINGS` under the config names."""
    return {name: getattr(fmt, attr) for name, attr in CHAT_SETTINGS.items()}


def chat_format_from_settings(settings: dict[str, Any], **kwargs: Any) -> ChatFormat:
    """The :class:`ChatFormat` of ``settings`` (config names; missing ones keep their defaults) and ``kwargs``."""
    given = {CHAT_SETTINGS[k]: v for k, v in settings.items() if k in CHAT_SETTINGS}
    return ChatFormat(**given, **kwargs)


def _base(env: gym.Env) -> Any:
    return getattr(env, "unwrapped", env)


def _ragen_prompt(base: Any) -> Any:
    hook = getattr(base, "ragen_prompt", None)
    return hook() if callable(hook) else None


def ragen_system_text(env: gym.Env) -> str:
    """RAGEN's system message for ``env`` (see :class:`ChatFormat` ``style="ragen"``)."""
    base = _base(env)
    prompt = _ragen_prompt(base)
    if prompt is None:
        return "You're a helpful assistant. " + str(getattr(base, "instructions", ""))
    text = prompt.instruction
    if prompt.legend:
        text += "\nThe meaning of each symbol in the state is:\n" + prompt.legend
    if base.action_names:  # RAGEN lists actions only for envs with an action lookup (ctx_manager.py:140-143)
        text += "\nYour available actions are:\n" + ", ".join(base.action_names)
        text += f'\nYou can make up to {base.max_actions} actions, separated by the action separator " || "\n'
    return "You're a helpful assistant. " + text


def ragen_turn_text(
    env: gym.Env, observation: str, *, turn: int, prev_info: dict[str, Any] | None = None
) -> str:
    """RAGEN's text for one turn (``_build_turn_state_content``), with the ``Reward:`` opening from turn 2."""
    base = _base(env)
    prompt = _ragen_prompt(base)
    max_tokens = _RAGEN_DEFAULT_MAX_TOKENS if prompt is None else prompt.max_tokens
    head = ""
    warning = ""
    if prev_info is not None:
        executed = prev_info.get("actions") or []
        parts = prev_info.get("reward_components") or {}
        game = sum(v for k, v in parts.items() if k != "format_penalty")
        # RAGEN sums executed actions' rewards from an int 0, so a turn without any prints "0".
        head = f"Reward:\n{game if executed else 0}\n"
        warning = "" if executed else _RAGEN_WARNING
    fmt = _RAGEN_FORMAT if getattr(base, "think", True) else _RAGEN_FORMAT_NO_THINK
    left = base.actions_left if hasattr(base, "actions_left") else 0
    return (
        f"{head}\nTurn {turn}:\nState:\n{observation}\n{warning}You have {left} actions left. Always output: {fmt} "
        f"with no extra text. Strictly follow this format. Max response length: {max_tokens} words (tokens).\n"
    )


def system_message(env: gym.Env, fmt: ChatFormat | None = None) -> dict[str, str]:
    """The system message: the assistant sentence plus the environment's instructions."""
    fmt = fmt or ChatFormat()
    if fmt.style == "ragen":
        return {"role": "system", "content": ragen_system_text(env)}
    parts = [fmt.system_prompt.strip()] if fmt.system_prompt else []
    if fmt.include_instructions:
        instructions = getattr(_base(env), "instructions", "")
        if instructions:
            parts.append(str(instructions).strip())
    return {"role": "system", "content": "\n".join(parts)}


def answer_format(env: gym.Env) -> str:
    """The response shape the environment parses."""
    think = getattr(_base(env), "think", True)
    return "<think>...</think><answer>...</answer>" if think else "<answer>...</answer>"


def turn_text(
    env: gym.Env,
    observation: str,
    *,
    turn: int,
    fmt: ChatFormat | None = None,
    prev_reward: float | None = None,
    prev_info: dict[str, Any] | None = None,
) -> str:
    """The user message for turn ``turn`` (1-based), showing ``observation`` and the budget left.

    ``prev_reward`` / ``prev_info`` describe the previous turn (``None`` on the first turn).
    """
    fmt = fmt or ChatFormat()
    if fmt.style == "ragen":
        return ragen_turn_text(env, observation, turn=turn, prev_info=prev_info)
    base = _base(env)
    lines = [f"Turn {turn}:"]
    if fmt.reward_feedback and prev_reward is not None:
        lines.append(f"Reward of your last answer: {prev_reward:g}")
    if prev_info is not None and not prev_info.get("action_is_valid", True):
        error = prev_info.get("error") or "invalid answer"
        lines.append(f"Warning: your last answer was invalid ({error}), so the state did not change.")
    lines.append("State:")
    lines.append(str(observation))
    if fmt.show_budget:
        budget = []
        if getattr(base, "action_names", None) and hasattr(base, "actions_left"):
            budget.append(f"{base.actions_left} actions")
        if hasattr(base, "turns_left"):
            budget.append(f"{base.turns_left} turns")
        if budget:
            lines.append(f"You have {' and '.join(budget)} left.")
    hint = f"Always answer in the format {answer_format(env)} with no other text"
    if fmt.max_response_tokens:
        hint += f", in at most {fmt.max_response_tokens} tokens"
    lines.append(hint + ".")
    return "\n".join(lines)


#: Seed of the example state shown by ``ChatFormat(one_shot=True)`` (outside the train and eval seed ranges).
EXAMPLE_SEED = 987_654


def _demo_env(env: gym.Env) -> gym.Env:
    """A copy of ``env`` with the same constructor arguments and no window, to be reset on its own."""
    spec = getattr(env, "spec", None)
    if spec is not None and spec.id == REMOTE_ID:
        # A served env's demonstration is played on a local env of the served id: the solver runs here (the
        # server mirrors no expert), and the served episodes equal local ones seed for seed.
        base = _base(env)
        return make_env(base.env_id, dict(base.env_kwargs))
    if spec is not None:
        kwargs = {k: v for k, v in dict(spec.kwargs).items() if k != "render_mode"}
        return make_env(spec.id, kwargs)
    # Built directly: only a copy keeps its arguments (vocab, dataset...). The window is not copied, and task
    # data is shared (read-only, cached per process) rather than duplicated.
    base = _base(env)
    memo: dict[int, Any] = {id(getattr(base, "_window", None)): None}
    if hasattr(base, "data"):
        memo[id(base.data)] = base.data
    try:
        demo = copy.deepcopy(base, memo)
    except Exception as e:  # noqa: BLE001 (any copy failure gets the same explanation)
        raise ValueError(
            f"cannot build the one-shot example for {type(base).__name__}: it has no env.spec and cannot be "
            f"copied ({e}); create it with gym.make(...)"
        ) from e
    demo.render_mode = None
    return demo


def example_exchange(env: gym.Env, fmt: ChatFormat | None = None) -> list[dict[str, str]]:
    """The demonstration: a fresh copy of ``env`` at :data:`EXAMPLE_SEED` and a well-formed answer (the env's
    example answer; which states and answers the other ``fmt.demonstration`` kinds show comes from
    :func:`llm_gym.agent.demonstrations.demonstration_answers`)."""
    from llm_gym.agent.demonstrations import demonstration_answers

    fmt = fmt or ChatFormat()
    demo = _demo_env(env)
    try:
        shown = (
            None
            if fmt.demonstration == "action"
            else demonstration_answers(demo, fmt.demonstration, EXAMPLE_SEED)
        )
        # "action", or a family without an expert or a solvable example state: the env's example answer
        if not shown:
            demo.reset(seed=EXAMPLE_SEED)  # an example answer may depend on the state (Countdown's numbers)
            base = _base(demo)
            answer = base.example_response() if hasattr(base, "example_response") else answer_format(env)
            shown = [(EXAMPLE_SEED, answer)]
        messages: list[dict[str, str]] = []
        for seed, answer in shown:
            obs, _ = demo.reset(seed=seed)
            messages += [
                {"role": "user", "content": turn_text(demo, obs, turn=1, fmt=fmt)},
                {"role": "assistant", "content": answer},
            ]
    finally:
        demo.close()
    return messages


@dataclass
class Conversation:
    """One episode's chat: the system message and alternating user (state) / assistant (reply) turns."""

    env: gym.Env
    fmt: ChatFormat = field(default_factory=ChatFormat)
    system: dict[str, str] = field(init=False)
    example: list[dict[str, str]] = field(init=False, default_factory=list)
    users: list[str] = field(init=False, default_factory=list)
    replies: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.system = system_message(self.env, self.fmt)
        self.example = example_exchange(self.env, self.fmt) if self.fmt.one_shot else []

    def add_observation(
        self, observation: str, *, reward: float | None = None, info: dict[str, Any] | None = None
    ) -> str:
        """Start the next turn with ``observation``; ``reward``/``info`` are those of the previous step."""
        if len(self.users) != len(self.replies):
            raise ValueError("add_observation called twice without a reply in between")
        text = turn_text(
            self.env,
            observation,
            turn=len(self.users) + 1,
            fmt=self.fmt,
            prev_reward=reward if self.users else None,
            prev_info=info if self.users else None,
        )
        self.users.append(text)
        return text

    @property
    def generation_prefix(self) -> str:
        """What the prompt ends with after the chat template's generation prompt, for this env:
        ``fmt.generation_prefix``, with RAGEN's ``<answer>`` in place of ``<think>`` when the env has ``think=False``
        (``ragen/llm_agent/ctx_manager.py``: ``text + "<think>"`` or ``text + "<answer>"``, and the same prefix
        put back before the generated text in ``get_env_inputs``). The reply given to the env and stored is
        prefix + generated text."""
        prefix = self.fmt.generation_prefix
        if prefix == "<think>" and not getattr(_base(self.env), "think", True):
            return "<answer>"
        return prefix

    def add_reply(self, text: str) -> None:
        if len(self.users) != len(self.replies) + 1:
            raise ValueError("add_reply called without a pending observation")
        self.replies.append(str(text))

    def messages(self, *, window: int | None = None) -> list[dict[str, str]]:
        """The chat so far (system first), keeping the last ``window`` turns (default: ``fmt.history_window``)."""
        window = self.fmt.history_window if window is None else window
        turns = len(self.users)
        first = 0 if window is None else max(0, turns - window)
        msgs = [dict(self.system), *(dict(m) for m in self.example)]
        for i in range(first, turns):
            msgs.append({"role": "user", "content": self.users[i]})
            if i < len(self.replies):
                msgs.append({"role": "assistant", "content": self.replies[i]})
        return msgs


def generation_prompt(tokenizer: Any, messages: list[dict[str, str]], generation_prefix: str = "") -> str:
    """The prompt text a policy generates from: the chat template with its generation prompt, then
    ``generation_prefix`` (RAGEN: ``apply_chat_template(..., add_generation_prompt=True) + "<think>"``).

    ``tokenizer`` is any object with Hugging Face's ``apply_chat_template``. The model's output continues the
    prefix, so the reply is ``generation_prefix + generated`` (what :func:`llm_gym.agent.rollout` stores).
    """
    from llm_gym.agent.templates import render_chat_template

    # the template is untrusted code: a deadline, and any failure as a ChatTemplateError (a ValueError)
    return render_chat_template(tokenizer, messages, add_generation_prompt=True) + generation_prefix
