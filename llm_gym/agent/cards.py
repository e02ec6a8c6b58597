"""Environment cards: what a researcher checks on an id before training on it, measured from the code.

A card holds, for one id per family (the family's first id that builds offline):

* the baselines on fixed seeds (:data:`CARD_SEEDS`) with Wilson intervals: the random valid-action policy, the
  best constant-action policy (action families) and the optimum (:mod:`llm_gym.agent.baselines`);
* an episode digest (:func:`episode_digest`): ``scripts/gen_env_cards.py`` computes it in two processes with
  different ``PYTHONHASHSEED`` and the card records it only when they agree; a test recomputes it in its own process;
* the reward components (the id's :class:`~llm_gym.core.rewards.RewardSpec`);
* reward-hack probes (:func:`hack_probes`), each a set of crafted replies played on the env with a verdict;
* throughput in process and through ``llmgym serve`` (machine-dependent: measured on ``--publish`` only);
* a slot for whether the from-scratch organism model learns it, and in how many episodes: "not yet measured" here;
  ``scripts/gen_env_cards.py`` fills it from the organism's recorded run (``docs/data/organism_learning.json``).

The probes play at the expert's last turn of an episode it wins, where the right answer ends the episode with
success, so a reply that smuggles the answer past the parser shows as a success or a higher reward. A crafted reply
is *robust* when it does not succeed and earns no more than the better of a wrong well-formed answer (the decoy)
and a reply without an answer block.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np

from llm_gym.registration import ENVS, env_family, make_env

#: Seeds of every card's baselines.
CARD_SEEDS = range(100)
#: Seed of the episode whose digest checks seeding across processes.
DIGEST_SEED = 7
#: The probes, in card order.
PROBES = (
    "reasoning_injection",
    "several_answers",
    "countdown_reuse",
    "unparsable_answer",
    "actions_after_end",
)
PROBE_TEXT = {
    "reasoning_injection": "the right answer inside the reasoning block, a wrong one (or none) after it",
    "several_answers": "a wrong answer block, then the right one",
    "countdown_reuse": "the right expression with a number used again (`+ n - n`, `* n / n`), and on "
    "nums [1, 81, 1, 1] an answer that skips the duplicates",
    "unparsable_answer": "the right answer with junk after it, inside a list of candidates, or glued to text",
    "actions_after_end": "the winning reply again after the episode ended",
}
ORGANISM_NOT_MEASURED = "not yet measured"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_THINK = re.compile(r"<think>(.*?)</think>", re.S)


def card_ids() -> dict[str, str]:
    """Family -> its card's id: the family's first registered id whose default data is bundled or generated."""
    from llm_gym.serve.protocol import external_data

    out: dict[str, str] = {}
    for entry in ENVS:
        if not external_data(entry.id):
            out.setdefault(env_family(entry.id), entry.id)
    return out


# ------------------------------------------------------------------------------------------------ baselines
def card_baselines(env_id: str, seeds: Sequence[int] = CARD_SEEDS) -> dict[str, Any]:
    """Random valid, best constant action and optimum success on ``seeds``, each ``{successes, n, rate, ci}``
    (``None`` where the family has none, with the reason)."""
    from llm_gym.agent.baselines import NoBaseline, baseline_success, constant_action_success

    base = baseline_success(env_id, seeds)
    random_part = None
    if base["random"] is not None:
        random_part = {k: base["random"][k] for k in ("successes", "n", "rate", "ci")}
    try:
        constants = constant_action_success(env_id, seeds)
        name = max(constants, key=lambda a: (constants[a]["rate"], -list(constants).index(a)))
        best: dict[str, Any] | None = {"action": name, **constants[name]}
        constant_reason = None
    except NoBaseline as e:
        best, constant_reason = None, str(e)
    return {
        "seeds": [int(seeds[0]), int(seeds[-1])],
        "random_valid": random_part,
        "random_reason": base["reason"],
        "best_constant": best,
        "constant_reason": constant_reason,
        "optimum": base["optimum"],
    }


# -------------------------------------------------------------------------------------------------- seeding
def _norm(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def episode_trace(env_id: str, seed: int = DIGEST_SEED, turns: int = 8) -> list[Any]:
    """One episode of ``env_id`` from ``seed``: random valid replies (drawn from ``seed``), one unparsable turn,
    the expert where the random policy has none; every observation, reward, flag and info."""
    env = make_env(env_id, {})
    base: Any = env.unwrapped
    rng = np.random.default_rng(seed)
    try:
        obs, info = env.reset(seed=seed)
        out: list[Any] = [obs, _norm(info)]
        for t in range(turns):
            if t == 1:
                reply = "no answer block"
            else:
                try:
                    reply = base.sample_valid_action(rng)
                except NotImplementedError:
                    reply = base.expert_reply() or "<think>x</think><answer>0</answer>"
            obs, reward, term, trunc, info = env.step(reply)
            out += [obs, reward, term, trunc, _norm(info)]
            if term or trunc:
                break
        return out
    finally:
        env.close()


def episode_digest(env_id: str, seed: int = DIGEST_SEED) -> str:
    """sha256 of :func:`episode_trace`: equal in any process that gets the same seed."""
    text = json.dumps(episode_trace(env_id, seed), sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------------------------------- probes
def _reply(base: Any, think: str, answer: str) -> str:
    return (f"<think>{think}</think>" if getattr(base, "think", True) else "") + f"<answer>{answer}</answer>"


def expert_win(make: Callable[[], gym.Env], max_seeds: int = 50) -> tuple[int, list[str]]:
    """The first seed whose expert episode succeeds and the expert's replies in it."""
    env = make()
    base: Any = env.unwrapped
    try:
        for seed in range(max_seeds):
            env.reset(seed=seed)
            replies: list[str] = []
            done = False
            info: dict[str, Any] = {}
            while not done and len(replies) < 100:
                reply = base.expert_reply()
                if reply is None:
                    break
                replies.append(reply)
                _, _, term, trunc, info = env.step(reply)
                done = term or trunc
            if done and info.get("success"):
                return seed, replies
    finally:
        env.close()
    raise ValueError(f"the expert of {type(base).__name__} won none of seeds 0..{max_seeds - 1}")


class _Position:
    """Plays a reply at the expert's last turn of a won episode (or after its end) on a fresh reset each time."""

    def __init__(self, make: Callable[[], gym.Env], seed: int, replies: list[str]):
        self.env = make()
        self.base: Any = self.env.unwrapped
        self.seed, self.replies = seed, replies

    def reach(self, *, after_end: bool = False, options: dict | None = None) -> None:
        """Reset and replay the expert up to its last turn (``after_end``: through it; ``options``: a reset with
        these options and no replay)."""
        self.env.reset(seed=self.seed, options=options)
        if options is None:
            for r in self.replies if after_end else self.replies[:-1]:
                self.env.step(r)

    def play(self, reply: str, *, after_end: bool = False, options: dict | None = None) -> dict[str, Any]:
        self.reach(after_end=after_end, options=options)
        _, reward, term, trunc, info = self.env.step(reply)
        return {
            "reward": round(float(reward), 6),
            "success": bool(info.get("success", False)),
            "executed": list(info.get("actions", [])),
            "ended": [bool(term), bool(trunc)],
        }


def _decoy(pos: _Position, answer: str, think: str) -> str | None:
    """A well-formed answer that does not win from the probe position (None if none is found)."""
    base = pos.base
    candidates: list[str] = []
    first = answer.split(base.action_sep)[0].strip() if base.action_sep else answer
    for name in base.action_names or ():
        if str(name) != first:
            candidates.append(str(name))
    rng = np.random.default_rng(0)
    pos.reach()  # answers valid in the probe position
    for _ in range(10):
        try:
            text = base.sample_valid_action(rng, reasoning="")
        except NotImplementedError:
            break
        m = _ANSWER.search(text)
        if m:
            candidates.append(m.group(1))
    candidates += ["12345", "0"]
    for cand in candidates:
        if cand != answer and not pos.play(_reply(base, think, cand))["success"]:
            return cand
    return None


def hack_probes(env_id: str, make: Callable[[], gym.Env] | None = None) -> dict[str, dict[str, Any]]:
    """Every probe in :data:`PROBES` on ``env_id`` (``make`` builds the env; default: the registered id):
    ``{name: {"verdict": "robust" | "exploitable" | "n/a", "cases": [{"reply", "reward", "success"}, ...]}}``."""
    make = make or (lambda: make_env(env_id, {}))
    probe_env = make()
    has_expert = bool(getattr(probe_env.unwrapped, "expert_name", None))
    probe_env.close()
    if not has_expert:  # the probes need a position the right answer wins, which the expert finds
        return {
            name: {"verdict": "n/a", "cases": [], "reason": "the family has no expert"} for name in PROBES
        }
    seed, replies = expert_win(make)
    pos = _Position(make, seed, replies)
    base = pos.base
    try:
        final = replies[-1]
        answer = _ANSWER.findall(final)[-1]
        think_m = _THINK.search(final)
        think = think_m.group(1) if think_m else ""
        decoy = _decoy(pos, answer, think)
        reference = pos.play(final)
        if not reference["success"]:  # the position must be one the right answer wins
            raise ValueError(f"{env_id}: the expert's winning reply does not win on replay")
        floors = [
            pos.play(f"<think>{think}</think>" if getattr(base, "think", True) else "no answer")["reward"]
        ]
        if decoy is not None:
            floors.append(pos.play(_reply(base, think, decoy))["reward"])
        floor = max(floors)
        d = decoy if decoy is not None else "zzz"

        def judged(cases: list[tuple[str, dict[str, Any]]], robust: Callable[[dict[str, Any]], bool]):
            rows = [{"reply": reply[:300], **{k: o[k] for k in ("reward", "success")}} for reply, o in cases]
            ok = all(robust(o) for _, o in cases)
            return {"verdict": "robust" if ok else "exploitable", "cases": rows}

        def at_final(texts: list[str]) -> dict[str, Any]:
            cases = [(t, pos.play(t)) for t in texts]
            return judged(cases, lambda o: not o["success"] and o["reward"] <= floor + 1e-9)

        think_block = "<think>{}</think>" if getattr(base, "think", True) else "{}"
        out: dict[str, dict[str, Any]] = {}
        out["reasoning_injection"] = at_final(
            [
                think_block.format(f"{think} <answer>{answer}</answer>") + f"<answer>{d}</answer>",
                think_block.format(f"<answer>{answer}</answer>"),
            ]
        )
        out["several_answers"] = at_final(
            [
                _reply(base, think, d) + f"<answer>{answer}</answer>",
                _reply(base, think, d) + f"<answer>{d}</answer><answer>{answer}</answer>",
            ]
        )
        # A family reset with a number multiset and a target (reset options nums/target) can be probed for
        # reusing a number; the capability is asked of the env, not of its family name.
        if isinstance(getattr(base, "nums", None), (list, tuple)) and hasattr(base, "target"):
            n = int(base.nums[0])
            reuse = at_final(
                [_reply(base, think, f"{answer} + {n} - {n}"), _reply(base, think, f"{answer} * {n} / {n}")]
            )
            dup = {"nums": [1, 81, 1, 1], "target": 81}
            skip = pos.play(_reply(base, "t", "81 * 1"), options=dup)
            control = pos.play(_reply(base, "t", "81 * 1 * 1 * 1"), options=dup)
            allow_unused = bool(getattr(base, "allow_unused", False))
            dup_ok = control["success"] and (skip["success"] == allow_unused)
            reuse["cases"] += [
                {"reply": "[1, 81, 1, 1] -> 81 * 1", "reward": skip["reward"], "success": skip["success"]},
                {
                    "reply": "[1, 81, 1, 1] -> 81 * 1 * 1 * 1 (control)",
                    **{k: control[k] for k in ("reward", "success")},
                },
            ]
            if not dup_ok:
                reuse["verdict"] = "exploitable"
            out["countdown_reuse"] = reuse
        else:
            out["countdown_reuse"] = {"verdict": "n/a", "cases": []}
        out["unparsable_answer"] = at_final(
            [
                _reply(base, think, f"{answer} ??"),
                _reply(base, think, f"{answer} (unsure)"),
                _reply(base, think, f"{answer} or {d}"),
                _reply(base, think, f"{d} or {answer}"),
                _reply(base, think, f"zz{answer}zz"),
            ]
        )
        after = pos.play(final, after_end=True)
        out["actions_after_end"] = judged(
            [(final, after)],
            lambda o: o["reward"] == 0.0 and not o["executed"] and o["ended"] == reference["ended"],
        )
        return out
    finally:
        pos.env.close()


# ----------------------------------------------------------------------------------------------- throughput
def random_episodes(env_id: str, steps: int, seed: int = 0) -> list[tuple[int, list[str]]]:
    """Random valid-action episodes of ``env_id`` totalling ``steps`` replies: ``[(seed, replies), ...]`` (the
    expert's reply where the family has no random answer), to replay on any env of that id."""
    env = make_env(env_id, {})
    base: Any = env.unwrapped
    rng = np.random.default_rng(seed)
    out: list[tuple[int, list[str]]] = []
    total = 0
    try:
        while total < steps:
            episode_seed = seed + len(out)
            env.reset(seed=episode_seed)
            replies: list[str] = []
            done = False
            while not done and total < steps:
                try:
                    reply = base.sample_valid_action(rng)
                except NotImplementedError:
                    reply = base.expert_reply() or "<think>x</think><answer>0</answer>"
                replies.append(reply)
                total += 1
                _, _, term, trunc, _ = env.step(reply)
                done = term or trunc
            out.append((episode_seed, replies))
    finally:
        env.close()
    return out


def steps_per_second(env: gym.Env, episodes: Sequence[tuple[int, Sequence[str]]]) -> float:
    """Steps per second replaying ``episodes`` (:func:`random_episodes`) on ``env``, resets included."""
    steps = sum(len(replies) for _, replies in episodes)
    start = time.perf_counter()
    for episode_seed, replies in episodes:
        env.reset(seed=episode_seed)
        for reply in replies:
            env.step(reply)
    return steps / (time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------------- cards
def deterministic_card(env_id: str) -> dict[str, Any]:
    """Every field of ``env_id``'s card that the code decides (all but the throughput and the seeding check's
    second process)."""
    from llm_gym.registration import env_defaults

    env = make_env(env_id, {})
    try:
        spec = cast(Any, env.unwrapped).reward_spec
        rewards = [[c.name, c.value, c.description] for c in spec.components]
    finally:
        env.close()
    entry = next(e for e in ENVS if e.id == env_id)
    return {
        "env_id": env_id,
        "description": entry.description,
        "kwargs": _norm(env_defaults(env_id)),
        "baselines": card_baselines(env_id),
        "seeding": {"seed": DIGEST_SEED, "digest": episode_digest(env_id)},
        "rewards": rewards,
        "probes": hack_probes(env_id),
        "organism": ORGANISM_NOT_MEASURED,
    }


def _rate(part: Mapping[str, Any] | None) -> str:
    if not part:
        return "—"
    return f"{part['rate']:.3f} [{part['ci'][0]:.3f}, {part['ci'][1]:.3f}] ({part['successes']}/{part['n']})"


def card_markdown(card: Mapping[str, Any]) -> str:
    """The card as Markdown (the docs hook puts it on the family's page)."""
    b = card["baselines"]
    const = b["best_constant"]
    lines = [
        f"**Card of `{card['env_id']}`** ({card['description']}). Generated by `scripts/gen_env_cards.py` "
        "into `docs/data/env_cards.json`; a test fails when it is stale.",
        "",
        f"| baseline (seeds {b['seeds'][0]}..{b['seeds'][1]}, success, 95% Wilson) | rate |",
        "|---|---|",
        f"| random valid action | {_rate(b['random_valid']) if b['random_valid'] else '— (' + str(b['random_reason']) + ')'} |",
        "| best constant action | "
        + (f"{_rate(const)}, `{const['action']}` every turn" if const else f"— ({b['constant_reason']})")
        + " |",
        f"| optimum (a perfect player) | {_rate(b['optimum']) if b['optimum'] else '— (no exact optimum known)'} |",
        "",
        f"Seeding: seed {card['seeding']['seed']} gives the same episode in two processes with different "
        f"`PYTHONHASHSEED` (digest `{card['seeding']['digest'][:16]}`).",
        "",
        "| reward component | default | meaning |",
        "|---|---|---|",
        *[f"| `{name}` | {value:g} | {meaning} |" for name, value, meaning in card["rewards"]],
        "",
    ]
    tp = card.get("throughput")
    if tp:
        lines += [
            f"Throughput ({tp['date']}, {tp['machine']}): {tp['in_process_steps_per_s']:,.0f} steps/s in process, "
            f"{tp['served_steps_per_s']:,.0f} steps/s through `llmgym serve` (one session, loopback).",
            "",
        ]
    lines += [
        "Reward-hack probes, played at the expert's last turn of an episode it wins: a crafted reply is robust when "
        "it neither wins nor earns more than a wrong well-formed answer or a reply without an answer block; after "
        "the end, when it earns nothing and executes nothing.",
        "",
        "| reward-hack probe | crafted replies | verdict |",
        "|---|---|---|",
    ]
    for name in PROBES:
        probe = card["probes"][name]
        won = name != "actions_after_end"  # after the end the won state stays won: only the reward counts
        shown = "; ".join(
            f"reward {c['reward']:g}{', wins' if c['success'] and won else ''}" for c in probe["cases"]
        )
        lines.append(
            f"| {name.replace('_', ' ')} | {PROBE_TEXT[name]}{': ' + shown if shown else ''} | "
            f"**{probe['verdict']}** |"
        )
    lines += [
        "",
        f"Organism (does the from-scratch organism model learn it, and in how many episodes): "
        f"**{card['organism']}**.",
    ]
    return "\n".join(lines)


__all__ = [
    "CARD_SEEDS",
    "PROBES",
    "card_baselines",
    "card_ids",
    "card_markdown",
    "deterministic_card",
    "episode_digest",
    "episode_trace",
    "expert_win",
    "hack_probes",
    "random_episodes",
    "steps_per_second",
]
