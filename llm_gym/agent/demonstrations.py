"""Format demonstrations that cannot become the policy (``ChatFormat(one_shot=True, demonstration=...)``).

The original demonstration (``demonstration="action"``) answers the env's example answer, a fixed legal action
(``Left`` on FrozenLake) whatever the state: a constant policy that an untrained model copies, and that GRPO then
reinforces on the boards where it happens to work (``docs/learning-study.md``). The kinds here show the answer
format without handing the model a constant answer:

* ``solver``: one example state (``llm_gym.agent.chat.EXAMPLE_SEED``) answered with the solver's move for
  *that* state, which is the right answer there and not a rule for other states;
* ``several``: :data:`SEVERAL` example states answered with the solver's moves, all different answers, so no
  single answer is demonstrated;
* ``placeholder``: one example state answered with a name that is no legal action (``ActionName``), so copying it
  is an invalid answer rather than a policy.

Example states come from a fresh copy of the env reset at seeds from ``EXAMPLE_SEED`` on (outside the training,
evaluation and pilot seed ranges); the search for solvable states with distinct answers is bounded
(:data:`MAX_EXAMPLE_SEEDS`): fewer found are shown as found. A family without an expert (``expert_name`` unset)
shows its own example answer for ``solver`` and ``several``, as ``action`` does. Free-answer envs have no action
names: their ``placeholder`` is the env's example answer (Bandit's ``ArmName``; Countdown's expression over other
numbers, well-formed and never right).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym

from llm_gym.core.parsing import ACTION_SEP, format_response

if TYPE_CHECKING:
    from llm_gym.core.env import TextEnv

#: Example states of ``demonstration="several"``.
SEVERAL = 3
#: Example seeds tried at most when looking for solvable states (and distinct answers).
MAX_EXAMPLE_SEEDS = 200
#: The placeholder answer of action environments: no environment has an action of this name.
PLACEHOLDER_ACTION = "ActionName"


def _placeholder(base: Any) -> str:
    names = list(getattr(base, "action_names", None) or [])
    if (
        not names
    ):  # free answers (Bandit's ArmName, Countdown's "..."): the env's example names no legal answer
        return base.example_response() if hasattr(base, "example_response") else ""
    if (
        PLACEHOLDER_ACTION in names
    ):  # pragma: no cover - no env has it; never show a legal action as placeholder
        raise ValueError(f"{type(base).__name__} has an action named {PLACEHOLDER_ACTION!r}")
    k = min(2, int(getattr(base, "max_actions_per_turn", 1)))
    return format_response(
        [PLACEHOLDER_ACTION] * k, "...", use_think=base.think, sep=base.action_sep or ACTION_SEP
    )


def demonstration_answers(demo: gym.Env, kind: str, first_seed: int) -> list[tuple[int, str]] | None:
    """The demonstration of ``kind`` as ``(seed, answer)`` pairs, one per turn, on ``demo`` (a copy of the
    episode's env that this function resets, at seeds from ``first_seed`` on); ``None``: show the env's own
    example answer (a family without an expert, no solvable example state, a free-answer env's placeholder
    without an example answer)."""
    if kind == "placeholder":
        demo.reset(seed=first_seed)
        answer = _placeholder(demo.unwrapped)
        return [(first_seed, answer)] if answer else None
    if kind not in ("solver", "several"):
        raise ValueError(f"no demonstration of kind {kind!r} here")
    base = cast("TextEnv", demo.unwrapped)
    if not base.expert_name:
        return None
    want = 1 if kind == "solver" else SEVERAL
    shown: list[tuple[int, str]] = []
    for seed in range(first_seed, first_seed + MAX_EXAMPLE_SEEDS):
        demo.reset(seed=seed)
        reply = base.expert_reply()
        if reply is None or reply in (answer for _, answer in shown):
            continue
        shown.append((seed, reply))
        if len(shown) == want:
            break
    # fewer solvable example states with distinct answers than wanted: those found, else the example answer
    return shown or None


__all__ = ["MAX_EXAMPLE_SEEDS", "PLACEHOLDER_ACTION", "SEVERAL", "demonstration_answers"]
