"""Train on llm-gym environments with TRL's stock ``GRPOTrainer`` and its tool-calling loop.

TRL (>= 1.16) accepts ``environment_factory``: a class whose public methods become tools the model may call,
with ``reset(**row)`` called before every rollout (its return text is appended to the prompt) and an optional
``get_reward()`` read once the rollout ends. :func:`make_environment_factory` builds such a class for any
``llmgym/*`` id:

* environments with a discrete action set (Sokoban, FrozenLake) get one tool per action (``up()``, ``left()``
  ...); each call executes that single action as one environment turn and returns the new state;
* answer environments (Countdown, MetaMathQA, Bandit) get one ``answer(text)`` tool;
* ``reset(seed=...)`` takes the dataset row's ``seed``, so the ``num_generations`` rollouts TRL draws for one row
  all start from the same state (group sampling per seed);
* transition randomness (FrozenLake's slips, Bandit payouts) is independent across those rollouts by default
  (``group_dynamics="independent"``, as in ``llmgym-train``): each reset also passes
  ``options={"dynamics_seed": k}``, with ``k`` from a counter shared by the factory's instances (TRL pools
  instances, one per concurrent rollout) or from the row's ``dynamics_seed`` column when it has one.
  ``group_dynamics="shared"`` resets with the seed only, so a group shares its transitions too;
* only llm-gym's own ids are accepted (not any Gymnasium id such as ``CartPole-v1``);
* ``get_reward()`` returns the episode return (the sum of the environment's rewards).

:func:`make_prompt_dataset` builds the matching ``datasets.Dataset`` (a ``prompt`` with the rules and the tool
instructions, and a ``seed`` column)::

    from trl import GRPOConfig, GRPOTrainer
    from llm_gym.integrations.trl import make_environment_factory, make_prompt_dataset

    factory = make_environment_factory("llmgym/Sokoban-v0")
    trainer = GRPOTrainer(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        args=GRPOConfig(max_tool_calling_iterations=10, num_generations=8),
        train_dataset=make_prompt_dataset("llmgym/Sokoban-v0", num_seeds=512),
        environment_factory=factory,
    )

Nothing here imports torch or TRL at module import time; :func:`make_prompt_dataset` imports ``datasets``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from llm_gym.core.checks import is_int
from llm_gym.core.parsing import ACTION_SEP, format_response
from llm_gym.registration import check_seed, check_trusted_env_id, make_env, resolve_env_id

__all__ = ["LLMGymToolEnv", "make_environment_factory", "make_prompt_dataset", "tool_prompt"]

#: Longest answer passed to an answer environment through the ``answer`` tool (the envs cap it again).
MAX_ANSWER_CHARS = 4096
#: Choices of ``group_dynamics`` (the trainer's ``--group_dynamics``).
GROUP_DYNAMICS = ("independent", "shared")


class LLMGymToolEnv:
    """Base class of the environments :func:`make_environment_factory` builds (one subclass per id).

    TRL turns every public *function* of the class into a tool, so everything here that is not a tool is private
    or a property. One instance serves many rollouts: TRL pools instances and calls :meth:`reset` before each.
    """

    env_id: str = ""
    env_kwargs: Mapping[str, Any] = {}
    group_dynamics: str = "independent"
    #: Source of ``dynamics_seed`` values (one per class, shared by its instances; replaced per built class).
    _dynamics_counter: Any = None

    def __init__(self) -> None:
        self._env = make_env(self.env_id, dict(self.env_kwargs))
        self._base: Any = self._env.unwrapped
        self._return = 0.0
        self._success = False
        self._done = False
        self._steps = 0

    def reset(self, **row: Any) -> str:
        """Start the episode of a dataset row: ``row["seed"]`` (an int in ``[0, 2**64)``) seeds it; with
        ``group_dynamics="independent"`` the transitions are seeded apart from the other rollouts of the row
        (``row["dynamics_seed"]`` when given, else the next value of the factory's counter). Other columns are
        ignored."""
        seed = check_seed(row.get("seed"), "the dataset's 'seed' column")
        options = None
        if self.group_dynamics == "independent":
            dynamics_seed = row.get("dynamics_seed")
            if dynamics_seed is None:
                dynamics_seed = next(type(self)._dynamics_counter)
            options = {"dynamics_seed": dynamics_seed}  # the env checks its range
        obs, _ = self._env.reset(seed=seed, options=options)
        self._return, self._success, self._done, self._steps = 0.0, False, False, 0
        return f"\n\nCurrent state:\n{obs}"

    def get_reward(self) -> float:
        """The episode return so far (0 when the model never called a tool)."""
        return float(self._return)

    # Properties are not tools (TRL lists functions only).
    @property
    def success(self) -> bool:
        """Whether the episode ended in success (the environment's ``info["success"]``)."""
        return self._success

    @property
    def done(self) -> bool:
        return self._done

    @property
    def env(self) -> gym.Env:
        """The wrapped Gymnasium environment."""
        return self._env

    def _act(self, answer_parts: list[str]) -> str:
        if self._done:
            # Raised errors reach the model as {"error": ...} and count in TRL's tools/failure_frequency.
            raise ValueError("the episode is over; no more actions are accepted")
        base = self._base
        text = format_response(answer_parts, "", use_think=base.think, sep=base.action_sep or ACTION_SEP)
        obs, reward, terminated, truncated, info = self._env.step(text)
        self._steps += 1
        self._return += float(reward)
        self._success = bool(info.get("success", False))
        self._done = bool(terminated or truncated)
        lines = [str(obs)]
        if info.get("error"):
            lines.append(f"Error: {info['error']}")
        lines.append(f"Reward: {float(reward):g}")
        if self._done:
            lines.append(f"The episode is over: {'success' if self._success else 'failure'}.")
        return "\n".join(lines)


def _tool_name(action: str) -> str:
    name = re.sub(r"\W+", "_", action.strip().lower()).strip("_")
    if not name or name[0].isdigit():
        name = f"action_{name}"
    if name in ("reset", "get_reward") or name.startswith("_"):
        raise ValueError(f"action {action!r} would shadow a reserved method of the TRL environment")
    return name


def _action_tool(action: str, describe: str):
    def tool(self) -> str:
        return self._act([action])

    tool.__name__ = tool.__qualname__ = _tool_name(action)
    # transformers' get_json_schema reads this Google-style docstring into the tool schema.
    tool.__doc__ = (
        f"{describe}\n\nReturns:\n    The new state, the step's reward and whether the episode is over.\n"
    )
    return tool


def _answer_tool(self, text: str) -> str:
    """Submit your final answer.

    Args:
        text: The answer only, e.g. an expression, a number or a name (no reasoning).

    Returns:
        Whether the answer was right, its reward and whether the episode is over.
    """
    if not isinstance(text, str):
        raise ValueError("text must be a string")
    return self._act([text[:MAX_ANSWER_CHARS]])


_answer_tool.__name__ = _answer_tool.__qualname__ = "answer"


def _class_name(env_id: str) -> str:
    bare = env_id.split("/", 1)[-1]
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[\W_]+", bare) if p) + "Env"


def _build_class(env_id: str, env_kwargs: dict[str, Any], base: Any, group_dynamics: str) -> type:
    namespace: dict[str, Any] = {
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs),
        "group_dynamics": group_dynamics,
        "_dynamics_counter": itertools.count(),  # next() on it is atomic under the GIL
        "__doc__": f"TRL environment for {env_id} (built by llm_gym.integrations.trl).",
        "__module__": __name__,
    }
    names = getattr(base, "action_names", None)
    if names:
        for action in names:
            name = _tool_name(action)
            if name in namespace:
                raise ValueError(f"actions of {env_id} map to the same tool name {name!r}")
            namespace[name] = _action_tool(action, f"Take the action {action} (one move, one turn).")
    else:
        namespace["answer"] = _answer_tool
    return type(_class_name(env_id), (LLMGymToolEnv,), namespace)


def make_environment_factory(
    env_id: str, *, group_dynamics: str = "independent", **env_kwargs: Any
) -> type[LLMGymToolEnv]:
    """A TRL ``environment_factory`` (a class; TRL calls it with no arguments) for the llm-gym id ``env_id``.

    ``env_kwargs`` go to the environment. One tool call executes one action and uses one environment turn, so for
    environments with discrete actions ``max_turns`` defaults to the action budget ``max_actions`` (the
    environment's own default allows several actions per turn); pass ``max_turns`` to override. Set TRL's
    ``max_tool_calling_iterations`` to at least that budget.

    ``group_dynamics``: ``"independent"`` (default, as ``llmgym-train``): the rollouts of one row share the start
    state but not the transition randomness; ``"shared"``: they share both (reset with the seed only).
    """
    import llm_gym  # noqa: F401  (registers the ids)

    if group_dynamics not in GROUP_DYNAMICS:
        raise ValueError(f"group_dynamics must be one of {GROUP_DYNAMICS}, got {group_dynamics!r}")
    env_id = check_trusted_env_id(resolve_env_id(env_id), "make_environment_factory")
    kwargs = dict(env_kwargs)
    probe = make_env(env_id, kwargs)
    try:
        base: Any = probe.unwrapped
        if getattr(base, "action_names", None) and "max_turns" not in kwargs:
            kwargs["max_turns"] = int(base.max_actions)
            kwargs.setdefault("max_actions_per_turn", 1)
        cls = _build_class(env_id, kwargs, base, group_dynamics)
    finally:
        probe.close()
    return cls


def tool_prompt(env_id: str, **env_kwargs: Any) -> str:
    """The prompt text: the game's rules and how to act through the tools of :func:`make_environment_factory`."""
    import llm_gym  # noqa: F401

    env = make_env(check_trusted_env_id(resolve_env_id(env_id), "tool_prompt"), env_kwargs)
    try:
        base: Any = env.unwrapped
        lines = [base.rules]
        names = getattr(base, "action_names", None)
        if names:
            tools = ", ".join(f"{_tool_name(a)}()" for a in names)
            lines.append(
                f"Act by calling the tools {tools}: each call takes one action and returns the new state. "
                f"You have {base.max_actions} actions in the episode."
            )
        else:
            lines.append("Give your final answer by calling the answer tool with the answer only.")
    finally:
        env.close()
    return "\n".join(lines)


def make_prompt_dataset(
    env_id: str,
    num_seeds: int,
    *,
    seed_start: int = 0,
    system_prompt: str | None = None,
    **env_kwargs: Any,
):
    """A ``datasets.Dataset`` of ``num_seeds`` rows: ``prompt`` (chat messages with :func:`tool_prompt`) and
    ``seed`` (``seed_start`` ... ``seed_start + num_seeds - 1``). TRL repeats each row ``num_generations``
    times, so every group of rollouts shares one seed. ``env_kwargs`` must match the factory's."""
    from datasets import Dataset

    if not is_int(num_seeds, numpy=False) or num_seeds < 1:
        raise ValueError(f"num_seeds must be a positive integer, got {num_seeds!r}")
    check_seed(seed_start, "seed_start", allow_none=False)
    check_seed(seed_start + num_seeds - 1, "the last seed (seed_start + num_seeds - 1)", allow_none=False)
    text = tool_prompt(env_id, **env_kwargs)
    messages = [{"role": "user", "content": text}]
    if system_prompt:
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return Dataset.from_dict(
        {
            "prompt": [messages] * num_seeds,
            "seed": list(range(seed_start, seed_start + num_seeds)),
        }
    )
