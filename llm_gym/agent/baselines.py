"""Reference points for a success rate: a random valid-action policy and the solver's optimum, on given seeds.

A trained model's success only means something beside what chance reaches under the same seeds and limits. The
random valid-action policy plays, every turn, a well-formed answer drawn uniformly at random from what the
environment accepts (no reasoning), as the env's :meth:`~llm_gym.core.TextEnv.sample_valid_action` draws it:
``actions_per_turn`` uniform action names for action environments, or a random valid answer for the current state
(a shown arm, an expression over the shown numbers). For free-text answer environments a random answer is
meaningless and no baseline is given.

The optimum is the share of seeds a perfect player solves within the turn and action limits, as the env's
:meth:`~llm_gym.core.TextEnv.optimum_solves` decides it (from a solver's optimal length, a shortest path, the
puzzle's solvability). It is ``None`` where no exact optimum is known (slippery FrozenLake, free-text answers).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from llm_gym.core.env import fits_limits
from llm_gym.core.parsing import ACTION_SEP, format_response


class NoBaseline(ValueError):
    """The environment has no meaningful random valid-action baseline (free-text answers)."""


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% for ``z=1.96``); ``(0, 1)`` when ``n == 0``."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if z <= 0:
        raise ValueError(f"z must be > 0, got {z}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact bounds at the extremes (no rounding)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def rate_with_interval(successes: int, n: int, z: float = 1.96) -> dict[str, Any]:
    """``{"successes", "n", "rate", "ci"}`` with the Wilson interval (``rate`` 0 when ``n == 0``)."""
    lo, hi = wilson_interval(successes, n, z)
    return {"successes": successes, "n": n, "rate": successes / n if n else 0.0, "ci": [lo, hi]}


def episode_outcomes(records: Sequence[Any]) -> dict[str, Any]:
    """Counts that separate the answer format from the task: episodes, successes, fully valid episodes (every
    turn a valid answer) and the successes among those, plus the mean per-turn valid-action rate.

    ``records`` are :class:`llm_gym.agent.records.EpisodeRecord` (``success``, ``turns[i].info``).
    """
    n = wins = valid = valid_wins = 0
    turn_rate = 0.0
    for r in records:
        flags = [bool(t.info.get("action_is_valid", False)) for t in r.turns]
        all_valid = bool(flags) and all(flags)
        n += 1
        wins += bool(r.success)
        valid += all_valid
        valid_wins += all_valid and bool(r.success)
        turn_rate += sum(flags) / len(flags) if flags else 0.0
    return {
        "episodes": n,
        "successes": wins,
        "valid_episodes": valid,
        "valid_successes": valid_wins,
        "valid_action_rate": turn_rate / n if n else 0.0,
    }


def outcome_summary(records: Sequence[Any], z: float = 1.96) -> dict[str, Any]:
    """Success, valid-answer rate (fully valid episodes) and success among fully valid episodes, each with its
    Wilson interval, and the per-turn valid-action rate."""
    o = episode_outcomes(records)
    return {
        "success": rate_with_interval(o["successes"], o["episodes"], z),
        "valid": rate_with_interval(o["valid_episodes"], o["episodes"], z),
        "success_given_valid": rate_with_interval(o["valid_successes"], o["valid_episodes"], z),
        "valid_action_rate": o["valid_action_rate"],
    }


def format_rate(s: Mapping[str, Any], digits: int = 3) -> str:
    """``0.250 [0.133, 0.421]`` (or ``- (n=0)``) for a :func:`rate_with_interval` dict."""
    if not s["n"]:
        return "- (n=0)"
    return f"{s['rate']:.{digits}f} [{s['ci'][0]:.{digits}f}, {s['ci'][1]:.{digits}f}]"


def format_outcomes(o: Mapping[str, Any]) -> str:
    """One line for :func:`outcome_summary`: success, valid answers and success among valid answers."""
    return (
        f"success {format_rate(o['success'])}, valid answers {format_rate(o['valid'], 2)}, "
        f"success among valid {format_rate(o['success_given_valid'], 2)}"
    )


def evaluation_report(
    env_id: str,
    seeds: Sequence[int],
    env_kwargs: Mapping[str, Any] | None,
    records: Sequence[Any],
    *,
    samples: int = 1,
    z: float = 1.96,
) -> dict[str, Any]:
    """The baselines on ``seeds`` and, for each evaluation round in ``records`` (grouped by ``meta["step"]``,
    in step order, each (seed, sample) once), its :func:`outcome_summary`. ``env_kwargs`` must hold the run's
    turn/action limits."""
    # An evaluation at a step that already has one (the periodic evaluation falling on max_steps, then the final
    # one) replaces it episode by episode: each (seed, sample) counts once, the later record winning.
    by_step: dict[int, dict[tuple[Any, Any], Any]] = {}
    for r in records:
        key = (r.seed, r.meta.get("group_index", 0))
        by_step.setdefault(int(r.meta.get("step", 0)), {})[key] = r
    rounds = {step: list(episodes.values()) for step, episodes in by_step.items()}
    return {
        "env": env_id,
        "seeds": [int(seeds[0]), int(seeds[-1])] if len(seeds) else [],
        "env_kwargs": dict(env_kwargs or {}),
        "baseline": baseline_success(env_id, seeds, env_kwargs, samples=samples, z=z),
        "evals": [{"step": s, **outcome_summary(rounds[s], z)} for s in sorted(rounds)],
    }


# ------------------------------------------------------------------------------------------------ policy
def random_valid_policy(env: Any, rng: np.random.Generator, actions_per_turn: int | None = None) -> str:
    """One random well-formed response for ``env``'s current state (``env`` may be wrapped), with empty reasoning.

    The env's :meth:`~llm_gym.core.TextEnv.sample_valid_action` with ``actions_per_turn`` (default: the env's
    per-turn limit) actions; one-answer envs give one random valid answer. Raises :class:`NoBaseline` for
    free-text answer environments. Draws only from ``rng``, never the env's RNG.
    """
    env = getattr(env, "unwrapped", env)
    if not callable(getattr(env, "sample_valid_action", None)):  # not an llm-gym env
        raise NoBaseline(f"{type(env).__name__} takes free-text answers; a random answer is meaningless")
    k = int(env.max_actions_per_turn) if actions_per_turn is None else int(actions_per_turn)
    try:
        return env.sample_valid_action(rng, actions_per_turn=k, reasoning="")
    except NotImplementedError as e:
        raise NoBaseline(str(e)) from None


# ------------------------------------------------------------------------------------------------ optimum
def optimum_solves(env: Any, info: Mapping[str, Any]) -> bool | None:
    """Whether a perfect player solves the episode just reset (``info`` from ``reset``); None if unknown. The env's
    :meth:`~llm_gym.core.TextEnv.optimum_solves` (``env`` may be wrapped)."""
    hook = getattr(getattr(env, "unwrapped", env), "optimum_solves", None)
    return hook(info) if callable(hook) else None


# ------------------------------------------------------------------------------------------------ runs
def _always(text: str) -> Callable[[], str]:
    """The policy that answers ``text`` every turn."""
    return lambda: text


def _play_out(env: Any, reply: Callable[[], str]) -> tuple[bool, int]:
    """Step ``env`` (just reset) with ``reply()`` each turn until the episode ends; ``(success, turns)``."""
    from llm_gym.agent.rollout import MAX_TURNS_GUARD

    done, t, info = False, 0, {}
    while not done and t < MAX_TURNS_GUARD:
        _, _, term, trunc, info = env.step(reply())
        done, t = term or trunc, t + 1
    return bool(info.get("success", False)), t


def _env_kwargs(
    env_kwargs: Mapping[str, Any] | None,
    max_turns: int | None,
    max_actions_per_turn: int | None,
    max_actions: int | None,
) -> dict[str, Any]:
    # The limits first and env_kwargs over them, as LLMGymGRPOConfig.make_env_kwargs does.
    kw: dict[str, Any] = {}
    for name, value in (
        ("max_turns", max_turns),
        ("max_actions_per_turn", max_actions_per_turn),
        ("max_actions", max_actions),
    ):
        if value is not None:
            kw[name] = value
    kw.update(dict(env_kwargs or {}))
    return kw


def baseline_success(
    env_id: str,
    seeds: Sequence[int],
    env_kwargs: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
    *,
    max_actions_per_turn: int | None = None,
    max_actions: int | None = None,
    actions_per_turn: int | None = None,
    samples: int = 1,
    rng_seed: int = 0,
    z: float = 1.96,
) -> dict[str, Any]:
    """Random valid-action success and the optimum on ``seeds`` under the same limits as the model's run.

    Returns ``{"random": {...} | None, "optimum": {...} | None, "reason": str | None}`` where each part holds
    ``successes``, ``n``, ``rate`` and the Wilson ``ci``; ``random`` also ``actions_per_turn`` and
    ``mean_turns``. Episode ``(seed, sample)`` draws from ``default_rng([rng_seed, seed, sample])``, so the
    result does not depend on the order or number of seeds asked for.
    """
    from llm_gym.agent.rollout import make_env

    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    kw = _env_kwargs(env_kwargs, max_turns, max_actions_per_turn, max_actions)
    env = make_env(env_id, kw)
    wins = episodes = turns = solvable = known = 0
    reason = None
    try:
        for seed in seeds:
            for sample in range(samples):
                _, info = env.reset(seed=int(seed))
                if sample == 0:
                    ok = optimum_solves(env, info)
                    if ok is not None:
                        known += 1
                        solvable += bool(ok)
                if reason is not None:
                    continue
                rng = np.random.default_rng([rng_seed, int(seed), sample])
                try:
                    won, t = _play_out(
                        env, functools.partial(random_valid_policy, env, rng, actions_per_turn)
                    )
                except NoBaseline as e:
                    reason = str(e)
                    continue
                episodes += 1
                turns += t
                wins += won
    finally:
        env.close()
    random_part = None
    if reason is None:
        random_part = {
            **rate_with_interval(wins, episodes, z),
            "actions_per_turn": actions_per_turn or getattr(env.unwrapped, "max_actions_per_turn", 1),
            "mean_turns": turns / episodes if episodes else 0.0,
        }
    optimum = rate_with_interval(solvable, known, z) if known == len(seeds) and known else None
    return {"random": random_part, "optimum": optimum, "reason": reason}


def constant_action_success(
    env_id: str,
    seeds: Sequence[int],
    env_kwargs: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
    *,
    max_actions_per_turn: int | None = None,
    max_actions: int | None = None,
    actions_per_turn: int | None = None,
    z: float = 1.96,
) -> dict[str, dict[str, Any]]:
    """Success of each input-independent policy "answer action ``a`` every turn" on ``seeds`` under the same
    limits, keyed by action name: what a model that collapsed to one template answer scores. A trained model
    must beat the best of them (not only the random policy) before it can be said to read the state. Each turn
    repeats the action ``actions_per_turn`` times (default: the env's per-turn limit, as the random policy).

    Action environments only; raises :class:`NoBaseline` otherwise (a constant Bandit arm *position* or
    Countdown expression has no fixed meaning across seeds)."""
    from llm_gym.agent.rollout import make_env

    env = make_env(env_id, _env_kwargs(env_kwargs, max_turns, max_actions_per_turn, max_actions))
    try:
        base: Any = env.unwrapped
        if not getattr(base, "action_names", None):
            raise NoBaseline(f"{type(base).__name__} has no fixed action names: no constant-action policy")
        limit = int(base.max_actions_per_turn)
        k = limit if actions_per_turn is None else int(actions_per_turn)
        if not 1 <= k <= limit:
            raise ValueError(f"actions_per_turn must be in [1, {limit}] (the env's per-turn limit), got {k}")
        out = {}
        for name in base.action_names:
            reply = format_response(
                [name] * k,
                "",
                use_think=bool(getattr(base, "think", False)),
                sep=base.action_sep or ACTION_SEP,
            )
            wins = 0
            for seed in seeds:
                env.reset(seed=int(seed))
                wins += _play_out(env, _always(reply))[0]
            out[str(name)] = rate_with_interval(wins, len(seeds), z)
        return out
    finally:
        env.close()


def format_baseline(b: Mapping[str, Any]) -> str:
    """``random valid 0.125 [0.050, 0.270], optimum 0.900 [...]`` for a summary line."""
    parts = []
    if b.get("random"):
        parts.append(f"random valid {format_rate(b['random'])}")
    elif b.get("reason"):
        parts.append("no random baseline")
    if b.get("optimum"):
        parts.append(f"optimum {format_rate(b['optimum'])}")
    return ", ".join(parts)


__all__ = [
    "NoBaseline",
    "baseline_success",
    "constant_action_success",
    "episode_outcomes",
    "evaluation_report",
    "format_outcomes",
    "format_rate",
    "outcome_summary",
    "fits_limits",
    "format_baseline",
    "optimum_solves",
    "random_valid_policy",
    "rate_with_interval",
    "wilson_interval",
]
