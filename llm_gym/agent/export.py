"""Expert data from llm-gym's own solvers: optimal episodes as a chat-format dataset, and a replay check.

Each row is one solved episode in the chat layout every llm-gym loop uses (:class:`~llm_gym.agent.chat.
Conversation`: a system message with the instructions, then one user message per state and the expert's reply
after it), so it can warm-start a policy with supervised fine-tuning (TRL ``SFTTrainer`` reads ``messages``) or
serve as the chosen side of preference pairs. Experts, re-planned from the current state on every turn:

* Sokoban: the breadth-first solver's optimal plan (fewest moves), ``max_actions_per_turn`` moves per turn.
* FrozenLake: the shortest hole-free path (breadth-first search over the map). Deterministic variants take
  ``max_actions_per_turn`` moves per turn and are optimal. On slippery ice no plan is sure to succeed: the
  expert takes one move per turn while it has turns to spare (more only when it would run out), re-plans after
  every slip, and only episodes that reach the goal are kept (slips come from the seeded env, so a kept episode
  replays identically). Those rows are successful, not optimal in expectation.
* Countdown: the reference expression the generator's exact solver found (``info["solution"]``).
* MetaMathQA: the data set's gold answer, with the data set's worked solution as the reasoning.
* Bandit: the arm with the highest expected payoff (``high_risk_prob * high_risk`` vs ``low_risk``); the
  high-risk arm with the default rewards.

Episodes the expert cannot solve (no solution found within the solver's budget, a slip into a hole) are skipped
and counted. Every row carries ``env_id``, ``seed``, ``env_kwargs`` (JSON text), ``llm_gym_version`` and the
``expert``; :func:`verify_rows` replays the assistant messages through a fresh env with the same seed and checks
that the episode ends in success.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from llm_gym.agent.chat import ChatFormat, Conversation
from llm_gym.core.parsing import ACTION_SEP, format_response
from llm_gym.registration import make_env, resolve_env_id

__all__ = [
    "ExportResult",
    "RowProblem",
    "export_dataset",
    "export_episodes",
    "read_jsonl",
    "verify_rows",
    "write_jsonl",
]

#: Longest line accepted by :func:`read_jsonl` (characters); rows are untrusted input.
MAX_LINE_CHARS = 10_000_000
#: Most messages replayed from one row (every llm-gym episode ends long before).
MAX_ROW_MESSAGES = 2000
#: Longest reasoning text copied from a data set's worked solution (MetaMathQA).
MAX_THINK_CHARS = 4000


@dataclass(frozen=True)
class _Move:
    think: str
    parts: list[str]


# ------------------------------------------------------------------------------------------------ experts
def _sokoban(env: Any) -> _Move | None:
    from llm_gym.envs.sokoban.solver import solve

    result = solve(env.current_level(), max_states=env.solver_max_states or 200_000)
    if not result.solved or len(result.plan) > env.actions_left:
        return None
    chunk = result.plan[: env.max_actions_per_turn]
    think = (
        f"The shortest solution from here takes {len(result.plan)} moves: {', '.join(result.plan)}. "
        f"Next: {', '.join(chunk)}."
    )
    return _Move(think, chunk)


_FL_DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def shortest_path(desc: Sequence[str], start: tuple[int, int]) -> list[str] | None:
    """The fewest moves from ``start`` to a ``G`` cell of a FrozenLake map avoiding ``H`` cells (breadth-first
    search, moves tried in Gymnasium's order Left, Down, Right, Up), or ``None`` when no path exists."""
    rows, cols = len(desc), len(desc[0])
    parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == "G":
            path = []
            while parent[cell] is not None:
                cell, move = parent[cell]  # type: ignore[misc]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in _FL_DELTAS.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if (
                0 <= nxt[0] < rows
                and 0 <= nxt[1] < cols
                and nxt not in parent
                and desc[nxt[0]][nxt[1]] != "H"
            ):
                parent[nxt] = (cell, move)
                queue.append(nxt)
    return None


def _frozen_lake(env: Any) -> _Move | None:
    path = shortest_path(env.desc, tuple(env.player))
    if not path or len(path) > env.actions_left:
        return None
    k = env.max_actions_per_turn
    if env.success_rate < 1.0:
        # Slippery: look at the result of each move unless the turns left cannot fit the path that way.
        k = min(k, max(1, math.ceil(len(path) / max(1, env.turns_left))))
    chunk = path[:k]
    think = f"The shortest safe path to the goal from here is {len(path)} moves: {', '.join(path)}."
    if env.success_rate < 1.0:
        think += " The ice is slippery, so I re-plan after every turn."
    return _Move(think, chunk)


def _countdown(env: Any) -> _Move | None:
    if not env.solution:
        return None
    return _Move(f"{env.solution} = {env.target}, using the numbers {env.nums}.", [env.solution])


def _metamathqa(env: Any) -> _Move | None:
    from llm_gym.envs.metamathqa.math_check import extract_gold

    response = env.data[env.index].get("response", "")
    think = ""
    if isinstance(response, str) and extract_gold(response) is not None:
        lower = response.lower()
        think = response[: lower.rfind("the answer is")].strip()[-MAX_THINK_CHARS:]
    return _Move(think, [env.gold])


def _bandit(env: Any) -> _Move | None:
    spec = env.reward_spec
    high_ev = env.high_risk_prob * spec["high_risk"]
    low_ev = spec["low_risk"]
    best = env.high_arm if high_ev >= low_ev else env.low_arm
    think = (
        f"{env.high_arm} pays {spec['high_risk']:g} with probability {env.high_risk_prob:g} "
        f"({high_ev:g} expected); {env.low_arm} pays {low_ev:g}. {best} has the higher expected payoff."
    )
    return _Move(think, [best])


_EXPERTS = {
    "SokobanEnv": ("bfs-solver", _sokoban),
    "FrozenLakeEnv": ("bfs-shortest-path", _frozen_lake),
    "CountdownEnv": ("reference-solution", _countdown),
    "MetaMathQAEnv": ("gold-answer", _metamathqa),
    "BanditEnv": ("expected-value", _bandit),
}


def _expert_for(env: gym.Env):
    name = type(env.unwrapped).__name__
    if name not in _EXPERTS:
        raise ValueError(f"no expert for {name}; export supports {', '.join(sorted(_EXPERTS))}")
    return _EXPERTS[name]


# ------------------------------------------------------------------------------------------------- export
@dataclass
class ExportResult:
    """What :func:`export_episodes` produced: ``rows`` (one per solved episode) and ``skipped`` (seed -> why)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)


def _kwargs_text(env_kwargs: Mapping[str, Any]) -> str:
    try:
        return json.dumps(dict(env_kwargs), sort_keys=True)
    except TypeError as e:
        raise ValueError(f"env_kwargs must be JSON-serialisable to be stored in each row: {e}") from None


def _seeds(seeds: Iterable[int]) -> list[int]:
    out = []
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"seeds must be non-negative integers, got {s!r}")
        out.append(s)
    return out


def export_episodes(
    env_id: str,
    seeds: Iterable[int],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    chat: ChatFormat | None = None,
) -> ExportResult:
    """Play every seed with the env's expert; keep the episodes that end in success as chat rows."""
    import llm_gym

    env_id = resolve_env_id(env_id)
    env_kwargs = dict(env_kwargs or {})
    kwargs_text = _kwargs_text(env_kwargs)
    chat = chat or ChatFormat()
    env = make_env(env_id, env_kwargs)
    result = ExportResult()
    try:
        expert_name, expert = _expert_for(env)
        base = env.unwrapped
        for seed in _seeds(seeds):
            obs, _ = env.reset(seed=seed)
            conv = Conversation(env, chat)
            conv.add_observation(obs)
            total, done, info, why = 0.0, False, {}, ""
            while not done:
                move = expert(base)
                if move is None:
                    why = "the expert found no solution within the budget"
                    break
                reply = format_response(
                    move.parts, move.think, use_think=base.think, sep=base.action_sep or ACTION_SEP
                )
                obs, reward, terminated, truncated, info = env.step(reply)
                conv.add_reply(reply)
                total += float(reward)
                done = terminated or truncated
                if not done:
                    conv.add_observation(obs, reward=float(reward), info=info)
            if not done or not info.get("success", False):
                result.skipped[seed] = why or "the episode did not end in success"
                continue
            result.rows.append(
                {
                    "messages": conv.messages(),
                    "env_id": env_id,
                    "seed": seed,
                    "env_kwargs": kwargs_text,
                    "llm_gym_version": llm_gym.__version__,
                    "expert": expert_name,
                    "episode_return": total,
                    "num_turns": len(conv.replies),
                }
            )
    finally:
        env.close()
    return result


def export_dataset(env_id: str, seeds: Iterable[int], **kwargs: Any):
    """:func:`export_episodes` as a ``datasets.Dataset`` (needs the ``datasets`` package)."""
    from datasets import Dataset

    return Dataset.from_list(export_episodes(env_id, seeds, **kwargs).rows)


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> int:
    """Write rows as JSON lines (UTF-8); returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL file, one at a time; a line over ``MAX_LINE_CHARS`` or not a JSON object is an error."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_CHARS + 1), ""), 1):
            if len(line) > MAX_LINE_CHARS:
                raise ValueError(f"{path}:{number}: line longer than {MAX_LINE_CHARS} characters")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: a row must be a JSON object")
            yield row


# ------------------------------------------------------------------------------------------------- replay
@dataclass(frozen=True)
class RowProblem:
    """A row that failed the replay check: its position, seed (if readable) and why."""

    index: int
    seed: Any
    reason: str


def _replay(row: Mapping[str, Any], env_kwargs: Mapping[str, Any]) -> str | None:
    env_id, seed, messages = row.get("env_id"), row.get("seed"), row.get("messages")
    # Records are untrusted: only registered llm-gym ids (never "module:Class" imports) and the caller's kwargs
    # (a row cannot point the env at a file of its choosing).
    if not isinstance(env_id, str) or not env_id.startswith("llmgym/") or env_id not in gym.registry:
        return f"env_id {env_id!r:.80} is not a registered llmgym/ id"
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        return f"seed {seed!r:.40} is not a non-negative integer"
    if row.get("env_kwargs", "{}") != _kwargs_text(env_kwargs):
        return (
            f"the row was exported with env_kwargs {str(row.get('env_kwargs'))[:200]}, not "
            f"{_kwargs_text(env_kwargs)}; pass the same env_kwargs to verify it"
        )
    if not isinstance(messages, list) or not 0 < len(messages) <= MAX_ROW_MESSAGES:
        return f"messages must be a list of 1 to {MAX_ROW_MESSAGES} chat messages"
    if not all(isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in messages):
        return "every message must be an object with a string 'content'"
    env = make_env(env_id, env_kwargs)
    try:
        obs, _ = env.reset(seed=seed)
        done, info = False, {}
        users = [m["content"] for m in messages if m.get("role") == "user"]
        replies = [m["content"] for m in messages if m.get("role") == "assistant"]
        if not replies:
            return "no assistant message to replay"
        for turn, reply in enumerate(replies):
            if done:
                return f"assistant message {turn + 1} comes after the episode ended"
            if turn >= len(users) or obs not in users[turn]:
                return f"user message {turn + 1} does not show the env's state for this seed"
            obs, _, terminated, truncated, info = env.step(reply)
            done = terminated or truncated
        if not done:
            return "the episode has not ended after the last assistant message"
        if not info.get("success", False):
            return "the replayed episode does not end in success"
    finally:
        env.close()
    return None


def verify_rows(
    rows: Iterable[Mapping[str, Any]], *, env_kwargs: Mapping[str, Any] | None = None
) -> list[RowProblem]:
    """Replay each row's assistant messages through a fresh env made with ``env_kwargs`` and the row's seed;
    return the rows whose episode does not end in success (or that are malformed). Empty list: all good."""
    problems = []
    kwargs = dict(env_kwargs or {})
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            problems.append(RowProblem(i, None, "a row must be a mapping"))
            continue
        try:
            reason = _replay(row, kwargs)
        except ValueError as e:  # e.g. env_kwargs the env rejects
            reason = str(e)
        if reason is not None:
            problems.append(RowProblem(i, row.get("seed"), reason))
    return problems
