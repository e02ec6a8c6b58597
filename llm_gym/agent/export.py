"""Expert data from llm-gym's own solvers: optimal episodes as a chat-format dataset, and a replay check.

Each row is one solved episode in the chat layout every llm-gym loop uses (:class:`~llm_gym.agent.chat.
Conversation`: a system message with the instructions, then one user message per state and the expert's reply
after it), so it can warm-start a policy with supervised fine-tuning (TRL ``SFTTrainer`` reads ``messages``) or
serve as the chosen side of preference pairs. The expert is the env family's own
(:meth:`~llm_gym.core.TextEnv.expert_move`, named by :attr:`~llm_gym.core.TextEnv.expert_name`), re-planned from
the current state on every turn (a solver's optimal plan, a shortest safe path, a reference solution, a gold
answer); each env's ``expert_move`` docstring says what its expert does.

Episodes the expert cannot solve (no solution found within the solver's budget, a slip into a hole) are skipped
and counted. Every row carries ``env_id``, ``seed``, ``env_kwargs`` (JSON text), ``llm_gym_version``, the
``expert``, the ``policy`` that played it, its ``success`` and the ``chat`` settings it was rendered with (JSON
text); :func:`verify_rows` replays the assistant messages through a fresh env with the same seed and checks that
an expert row's episode ends in success.

Besides the expert, the **random valid-action policy** (:func:`llm_gym.agent.baselines.random_valid_policy`, the
same stream as the random baseline on those seeds) plays episodes that teach the answer format without a policy;
``expert_fraction`` mixes the two, seed by seed (:func:`plays_expert`). Random episodes are kept whether they
succeed or not.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np

from llm_gym import _jsonl
from llm_gym.agent.chat import ChatFormat, Conversation, chat_settings
from llm_gym.core.checks import is_number
from llm_gym.registration import check_seed, check_trusted_env_id, make_env, resolve_env_id

if TYPE_CHECKING:
    from llm_gym.core.env import TextEnv

__all__ = [
    "EXPERT_POLICY",
    "RANDOM_POLICY",
    "ExportResult",
    "RowProblem",
    "RowProblems",
    "export_dataset",
    "export_episodes",
    "expert_reply",
    "iter_export",
    "plays_expert",
    "read_jsonl",
    "verify_rows",
    "write_jsonl",
]

#: Most messages replayed from one row (every llm-gym episode ends long before).
MAX_ROW_MESSAGES = 2000
#: ``policy`` of the rows each player writes.
EXPERT_POLICY, RANDOM_POLICY = "expert", "random-valid"


def _expert_for(env: gym.Env) -> str:
    """The name of ``env``'s expert policy, or ``ValueError`` when its family has none."""
    base = env.unwrapped
    name = getattr(base, "expert_name", None)
    if not name:
        raise ValueError(
            f"no expert for {type(base).__name__}: export needs an env whose family implements "
            "TextEnv.expert_move and sets expert_name"
        )
    return name


def expert_reply(env: gym.Env) -> str | None:
    """The expert's reply for ``env``'s current state (just reset or mid-episode), or None when it has no plan
    from here. Raises ``ValueError`` for a family without an expert."""
    _expert_for(env)
    return cast("TextEnv", env.unwrapped).expert_reply()


def plays_expert(seed: int, expert_fraction: float, rng_seed: int = 0) -> bool:
    """Whether the expert (rather than the random valid-action policy) plays ``seed`` when a share
    ``expert_fraction`` of the seeds goes to the expert: each seed independently, from
    ``default_rng([rng_seed, seed, 1])`` (deterministic and independent of the other seeds and their order)."""
    if expert_fraction >= 1.0:
        return True
    if expert_fraction <= 0.0:
        return False
    return bool(np.random.default_rng([rng_seed, seed, 1]).random() < expert_fraction)


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


def _seeds(seeds: Iterable[int]) -> Iterator[int]:
    # checked one by one as they are played: a range of 10^8 seeds is never a list
    return (check_seed(s, "each seed", allow_none=False) for s in seeds)  # the rule records and rows follow


def export_episodes(
    env_id: str,
    seeds: Iterable[int],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    chat: ChatFormat | None = None,
    expert_fraction: float = 1.0,
    rng_seed: int = 0,
) -> ExportResult:
    """Play every seed with the env's expert (kept when the episode ends in success) or, for a share
    ``1 - expert_fraction`` of the seeds (:func:`plays_expert`), with the random valid-action policy (always kept);
    return the chat rows and the skipped seeds."""
    result = ExportResult()
    rows = iter_export(
        env_id, seeds, env_kwargs=env_kwargs, chat=chat, expert_fraction=expert_fraction, rng_seed=rng_seed
    )
    for seed, row, why in rows:
        if row is None:
            result.skipped[seed] = why
        else:
            result.rows.append(row)
    return result


def iter_export(
    env_id: str,
    seeds: Iterable[int],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    chat: ChatFormat | None = None,
    expert_fraction: float = 1.0,
    rng_seed: int = 0,
) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    """:func:`export_episodes` one seed at a time: ``(seed, row, "")`` for a kept episode, ``(seed, None, why)``
    for a skipped one. Memory does not grow with the number of seeds (``llmgym export`` writes rows as they
    come)."""
    import llm_gym
    from llm_gym.agent.baselines import random_valid_policy

    if not is_number(expert_fraction) or not 0.0 <= expert_fraction <= 1.0:
        raise ValueError(f"expert_fraction must be in [0, 1], got {expert_fraction!r}")
    env_id = resolve_env_id(env_id)
    env_kwargs = dict(env_kwargs or {})
    kwargs_text = _kwargs_text(env_kwargs)
    chat = chat or ChatFormat()
    chat_text = json.dumps(chat_settings(chat), sort_keys=True)
    env = make_env(env_id, env_kwargs)
    try:
        expert_name = _expert_for(env) if expert_fraction > 0 else ""
        for seed in _seeds(seeds):
            expert_row = plays_expert(seed, expert_fraction, rng_seed)
            obs, _ = env.reset(seed=seed)
            conv = Conversation(env, chat)
            conv.add_observation(obs)
            info: dict[str, Any]
            total, done, info, why = 0.0, False, {}, ""
            rng = np.random.default_rng([rng_seed, seed, 0])  # the random baseline's stream for this seed
            while not done:
                reply = expert_reply(env) if expert_row else random_valid_policy(env, rng)
                if reply is None:
                    why = "the expert found no solution within the budget"
                    break
                obs, reward, terminated, truncated, info = env.step(reply)
                conv.add_reply(reply)
                total += float(reward)
                done = terminated or truncated
                if not done:
                    conv.add_observation(obs, reward=float(reward), info=info)
            if not done or (expert_row and not info.get("success", False)):
                yield seed, None, why or "the episode did not end in success"
                continue
            yield (
                seed,
                {
                    "messages": conv.messages(),
                    "env_id": env_id,
                    "seed": seed,
                    "env_kwargs": kwargs_text,
                    "llm_gym_version": llm_gym.__version__,
                    "expert": expert_name if expert_row else RANDOM_POLICY,
                    "policy": EXPERT_POLICY if expert_row else RANDOM_POLICY,
                    "chat": chat_text,
                    "episode_return": total,
                    "num_turns": len(conv.replies),
                    "success": bool(info.get("success", False)),
                },
                "",
            )
    finally:
        env.close()


def export_dataset(env_id: str, seeds: Iterable[int], **kwargs: Any):
    """:func:`export_episodes` as a ``datasets.Dataset`` (needs the ``datasets`` package)."""
    from datasets import Dataset

    return Dataset.from_list(export_episodes(env_id, seeds, **kwargs).rows)


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> int:
    """Write rows as JSON lines (UTF-8); returns how many. The file is replaced only once every row was
    written (a full disk leaves the previous file, or none)."""
    from llm_gym.safe_io import atomic_write

    n = 0
    with atomic_write(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL file, one at a time; a line over the JSONL reader's cap (``llm_gym._jsonl.MAX_LINE_BYTES``),
    not UTF-8 JSON, or not a JSON object is a ``ValueError`` naming the file and line."""
    with open(path, "rb") as f:
        for number, raw in _jsonl.iter_lines(f, path=str(path)):
            if not raw.strip():
                continue
            try:
                row = _jsonl.decode_json(raw)
            except ValueError as e:
                raise ValueError(f"{path}:{number}: {e}") from None
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


class RowProblems(list):
    """The rows that failed (a list of :class:`RowProblem`, the first ``keep`` of them when :func:`verify_rows`
    was given ``keep``) and ``failed``, how many failed in all."""

    failed: int = 0


def _replay(row: Mapping[str, Any], env_kwargs: Mapping[str, Any], chat: ChatFormat) -> str | None:
    env_id, seed, messages = row.get("env_id"), row.get("seed"), row.get("messages")
    # Records are untrusted: only registered llm-gym ids (never "module:Class" imports) and the caller's kwargs
    # (a row cannot point the env at a file of its choosing).
    try:
        env_id = check_trusted_env_id(env_id, "the row")
        check_seed(seed, allow_none=False)
    except ValueError as e:
        return str(e)
    if row.get("env_kwargs", "{}") != _kwargs_text(env_kwargs):
        return (
            f"the row was exported with env_kwargs {str(row.get('env_kwargs'))[:200]}, not "
            f"{_kwargs_text(env_kwargs)}; pass the same env_kwargs to verify it"
        )
    if not isinstance(messages, list) or not 0 < len(messages) <= MAX_ROW_MESSAGES:
        return f"messages must be a list of 1 to {MAX_ROW_MESSAGES} chat messages"
    if not all(isinstance(m, Mapping) and isinstance(m.get("content"), str) for m in messages):
        return "every message must be an object with a string 'content'"
    replies = [m["content"] for m in messages if m.get("role") == "assistant"]
    if not replies:
        return "no assistant message to replay"
    env = make_env(env_id, env_kwargs)
    try:
        # Re-render the whole conversation (system, user and tool messages) from the env and the row's replies,
        # exactly as export wrote it, and compare every message.
        obs, _ = env.reset(seed=seed)
        conv = Conversation(env, chat)
        conv.add_observation(obs)
        info: dict[str, Any]
        done, info = False, {}
        for turn, reply in enumerate(replies):
            if done:
                return f"assistant message {turn + 1} comes after the episode ended"
            obs, reward, terminated, truncated, info = env.step(reply)
            conv.add_reply(reply)
            done = terminated or truncated
            if not done:
                conv.add_observation(obs, reward=float(reward), info=info)
        expected = conv.messages()
        if not done:
            expected = expected[:-1]  # the next state, never answered: a truncated row ends before it
        for i, (want, got) in enumerate(zip(expected, messages)):
            if got.get("role") != want["role"] or got["content"] != want["content"]:
                return (
                    f"message {i + 1} ({str(got.get('role'))[:20]}) differs from the env's conversation for this "
                    f"seed (expected a {want['role']} message showing the env's state and text)"
                )
        if len(messages) != len(expected):
            return f"the row has {len(messages)} messages; replaying its replies gives {len(expected)}"
        if not done:
            return "the episode has not ended after the last assistant message"
        if row.get("policy") != RANDOM_POLICY and not info.get("success", False):
            return "the replayed episode does not end in success"
    finally:
        env.close()
    return None


def verify_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    chat: ChatFormat | None = None,
    keep: int | None = None,
) -> RowProblems:
    """Replay each row's assistant messages through a fresh env made with ``env_kwargs`` and the row's seed,
    re-render the conversation with ``chat`` (the :class:`ChatFormat` the rows were exported with; default
    ``ChatFormat()``, as ``llmgym export``) and compare every message exactly; return the rows that differ, whose
    episode does not end in success, or that are malformed. Empty list: all good.

    ``keep``: hold only the first ``keep`` problems (``.failed`` still counts all), so a file of millions of bad
    rows costs constant memory (``llmgym export --check`` keeps the 20 it prints)."""
    problems = RowProblems()
    kwargs = dict(env_kwargs or {})
    chat = chat or ChatFormat()
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            problem = RowProblem(i, None, "a row must be a mapping")
        else:
            try:
                reason = _replay(row, kwargs, chat)
            except ValueError as e:  # e.g. env_kwargs the env rejects
                reason = str(e)
            if reason is None:
                continue
            problem = RowProblem(i, row.get("seed"), reason)
        problems.failed += 1
        if keep is None or len(problems) < keep:
            problems.append(problem)
    return problems
