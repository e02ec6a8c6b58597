"""The batched, turn-synchronous multi-turn rollout loop for any text policy (no torch needed).

``rollout`` plays ``P`` seeds x ``G`` environments that share each seed (group sampling). On every turn all
still-active environments go to the policy in one call, so a batched backend (HF ``generate``, vLLM, an API with
batching) sees one batch per turn. Results are :class:`EpisodeRecord` objects in seed-major group order:
``[seed0 g0, seed0 g1, ..., seed1 g0, ...]``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import gymnasium as gym

from llm_gym.agent.chat import ChatFormat, Conversation
from llm_gym.agent.records import EpisodeRecord, TurnRecord
from llm_gym.core.checks import is_int
from llm_gym.registration import make_env, pick_env_url

#: A batch of chat message lists -> one response text each (same order, same length). When the chat format has a
#: generation prefix (``ChatFormat(style="ragen")``: ``<think>``), the policy is called as
#: ``policy(batch, generation_prefix=prefix)``: each prompt must end with the chat template's generation prompt
#: followed by ``prefix`` (:func:`llm_gym.agent.chat.generation_prompt`), and the policy returns only the text
#: generated after it.
Policy = Callable[..., list[str]]

#: Hard stop for environments that never end by themselves (every llm-gym env truncates long before this).
MAX_TURNS_GUARD = 1000


def _validate_seeds(seeds: Sequence[int]) -> list[int]:
    out = []
    for s in seeds:
        if not is_int(s) or s < 0:
            raise ValueError(f"seeds must be non-negative integers, got {s!r}")
        out.append(int(s))
    return out


def _takes_generation_prefix(policy: Policy) -> bool:
    try:
        params = inspect.signature(policy).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    return any(p.name == "generation_prefix" or p.kind is p.VAR_KEYWORD for p in params)


def rollout(
    env_id: str,
    seeds: Sequence[int],
    policy: Policy,
    *,
    group_size: int = 1,
    env_kwargs: dict | None = None,
    chat: ChatFormat | None = None,
    meta: dict | None = None,
    env_url: str | Sequence[str] | None = None,
) -> list[EpisodeRecord]:
    """Play ``len(seeds) x group_size`` episodes with ``policy``, one policy call per turn.

    Args:
        env_id: a registered id such as ``"llmgym/FrozenLake-v0"``.
        seeds: reset seeds, one per group; the ``group_size`` environments of a group share their seed.
        policy: maps a batch of message lists to one response each.
        group_size: environments per seed (``G``).
        env_kwargs: passed to ``gym.make``.
        chat: how observations become messages (default :class:`ChatFormat`). With a generation prefix (RAGEN
            style), the policy gets ``generation_prefix=`` (see :data:`Policy`), and the env, the conversation and
            the record get prefix + generated text, as RAGEN's env does.
        meta: extra keys stored in every record's ``meta`` (e.g. model name, step).
        env_url: play on ``llmgym serve`` servers instead of in-process (one address, or several used in turn
            per episode); the records are the same.

    Returns:
        One :class:`EpisodeRecord` per environment, seed-major; ``meta`` holds ``group`` (seed index) and
        ``group_index`` (position inside the group).
    """
    seeds = _validate_seeds(seeds)
    if not is_int(group_size, numpy=False) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    chat = chat or ChatFormat()
    if chat.generation_prefix and not _takes_generation_prefix(policy):
        # Silently dropping the prefix would run a different protocol (the model would not start inside <think>).
        raise ValueError(
            f"chat style {chat.style!r} ends every prompt with {chat.generation_prefix!r}: the policy must take a "
            "generation_prefix= keyword, end its prompt with it and return the text generated after it"
        )
    env_kwargs = dict(env_kwargs or {})
    envs: list[gym.Env] = []
    convs: list[Conversation] = []
    records: list[EpisodeRecord] = []
    try:
        for p, seed in enumerate(seeds):
            for g in range(group_size):
                env = make_env(env_id, env_kwargs, env_url=pick_env_url(env_url, len(envs)))
                obs, _info = env.reset(seed=seed)
                conv = Conversation(env, chat)
                conv.add_observation(obs)
                envs.append(env)
                convs.append(conv)
                records.append(
                    EpisodeRecord.from_reset(
                        env,
                        env_id,
                        seed,
                        obs,
                        env_kwargs=env_kwargs,
                        meta={**(meta or {}), "group": p, "group_index": g},
                    )
                )
        active = list(range(len(envs)))
        turns = 0
        while active:
            turns += 1
            if turns > MAX_TURNS_GUARD:
                raise RuntimeError(f"{env_id} did not end within {MAX_TURNS_GUARD} turns")
            batch = [convs[i].messages() for i in active]
            # Every env of a rollout has the same kwargs, so one prefix serves the batch.
            prefix = convs[active[0]].generation_prefix
            responses = policy(batch, generation_prefix=prefix) if prefix else policy(batch)
            if not isinstance(responses, (list, tuple)) or len(responses) != len(active):
                got = len(responses) if isinstance(responses, (list, tuple)) else type(responses).__name__
                raise ValueError(f"policy must return a list of {len(active)} responses, got {got}")
            still = []
            for i, text in zip(active, responses):
                text = prefix + ("" if text is None else str(text))
                obs, reward, terminated, truncated, info = envs[i].step(text)
                convs[i].add_reply(text)
                records[i].turns.append(TurnRecord.from_step(text, obs, reward, terminated, truncated, info))
                if not (terminated or truncated):
                    convs[i].add_observation(obs, reward=float(reward), info=info)
                    still.append(i)
            active = still
    finally:
        for env in envs:
            env.close()
    return records


def episode_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Mean per-episode metrics: success, turns, valid/effective action rates (per turn), episode reward."""
    if not records:
        return {}
    n = len(records)

    def rate(rec: EpisodeRecord, key: str) -> float:
        if not rec.turns:
            return 0.0
        return sum(bool(t.info.get(key, False)) for t in rec.turns) / len(rec.turns)

    return {
        "success": sum(r.success for r in records) / n,
        "turns": sum(len(r.turns) for r in records) / n,
        "valid_action_rate": sum(rate(r, "action_is_valid") for r in records) / n,
        "effective_action_rate": sum(rate(r, "action_is_effective") for r in records) / n,
        "episode_reward": sum(r.total_reward for r in records) / n,
    }


def group_seeds(base_seed: int, step: int, num_groups: int) -> list[int]:
    """RAGEN seeding: group ``g`` at rollout step ``s`` uses ``base_seed + s * P + g``."""
    if num_groups < 1 or step < 0 or base_seed < 0:
        raise ValueError("base_seed and step must be >= 0 and num_groups >= 1")
    return [base_seed + step * num_groups + g for g in range(num_groups)]


__all__ = ["MAX_TURNS_GUARD", "Policy", "episode_metrics", "group_seeds", "make_env", "rollout"]
