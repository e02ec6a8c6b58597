"""Write the environment cards (``docs/data/env_cards.json``) from the code: one card per family.

    python scripts/gen_env_cards.py             # regenerate every field the code decides; keep the throughput
                                                #   (measured for a new family's card)
    python scripts/gen_env_cards.py --publish   # also measure the throughput (in process and through llmgym serve)
    python scripts/gen_env_cards.py --check     # exit 1 when a committed card is stale (what the test runs)

What goes in a card: ``llm_gym.agent.cards``; the organism line comes from the organism's recorded runs
(``docs/data/organism_learning.json``). The seeding check runs the card's episode in two processes with
different ``PYTHONHASHSEED`` and stops here if they differ. Throughput depends on the machine, so it is measured
only with ``--publish`` and left out of ``--check``. The docs hook ``docs/hooks/env_cards.py`` renders each card
where a family page writes ``<!-- env-card: FAMILY -->``; ``tests/test_env_cards.py`` fails when a card is stale.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CARDS = ROOT / "docs" / "data" / "env_cards.json"
#: Fields of a card that depend on the machine (not compared by --check).
MACHINE_FIELDS = ("throughput",)
IN_PROCESS_STEPS, SERVED_STEPS = 3000, 300

_DIGESTS = (
    "import json, sys; from llm_gym.agent.cards import episode_digest; "
    "print(json.dumps({i: episode_digest(i) for i in sys.argv[1:]}))"
)


#: The organism's recorded runs (``benchmarks/organism_learning.py --publish``) and the profile they ran.
ORGANISM_DATA = ROOT / "docs" / "data" / "organism_learning.json"
ORGANISM_PROFILES = ROOT / "trainer" / "profiles" / "organism"


def _rate(s: dict[str, Any]) -> str:
    return f"{s['rate']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]"


def organism_slot(env_id: str, data: dict[str, Any] | None = None) -> str | None:
    """The card's organism line from the recorded run on ``env_id`` (None when there is none): whether the
    organism learned it (success after RL above random valid's and the warm start's intervals, the run's own
    verdict), after how many RL steps and training episodes (the profile's seeds x rollouts per step), and the
    same policy on the family's other recorded ids (e.g. unseen arm pairs)."""
    import yaml
    from llm_gym.trainer.resolve import short_env_name

    from llm_gym.registration import env_family

    data = json.loads(ORGANISM_DATA.read_text(encoding="utf-8")) if data is None else data
    # the card's own id, else the family's id a profile ran on (FrozenLake's: the 3x3 CoordFrozenLake)
    recorded = [
        other
        for other, runs in data.get("envs", {}).items()
        if env_family(other) == env_family(env_id) and "rl_steps" in runs.get("grpo", {})
    ]
    ran = env_id if env_id in recorded else (recorded[0] if recorded else None)
    if ran is None:
        return None
    run = data["envs"][ran]["grpo"]
    profile = yaml.safe_load((ORGANISM_PROFILES / f"{short_env_name(ran)}.yaml").read_text(encoding="utf-8"))
    episodes = run["rl_steps"] * profile["num_prompts"] * profile["num_generations"]
    verdict = "learns it" if run["learned"] else "does not learn it"
    text = (
        f"{verdict}: held-out success {_rate(run['after']['success'])} after {run['rl_steps']} GRPO steps "
        f"({episodes:,} training episodes, after a {profile['warm_start_episodes']:,}-episode warm start at "
        f"{_rate(run['warm_start']['success'])}); random valid {_rate(run['baselines']['random'])}"
    )
    if ran != env_id:
        text = f"on {ran.split('/', 1)[1]} ({json.dumps(profile.get('env_kwargs', {}))}): {text}"
    for other, runs in data.get("envs", {}).items():
        held = runs.get("grpo", {})
        if other not in (env_id, ran) and env_family(other) == env_family(env_id) and "after" in held:
            text += (
                f"; {other.split('/', 1)[1]}: {_rate(held['after']['success'])}, random valid "
                f"{_rate(held['baselines']['random'])} ({'learned' if held.get('learned') else 'not learned'})"
            )
    return f"{text} (`{run['command']}`, {run.get('date', data['date'])})"


def deterministic_cards() -> dict[str, dict[str, Any]]:
    """Family -> the fields of its card the code and its recorded runs decide (this process only)."""
    from llm_gym.agent.cards import card_ids, deterministic_card

    cards = {family: deterministic_card(env_id) for family, env_id in card_ids().items()}
    for card in cards.values():
        card["organism"] = organism_slot(card["env_id"]) or card["organism"]
    return cards


def digests_in_subprocesses(env_ids: list[str]) -> list[dict[str, str]]:
    """The episode digests of ``env_ids`` from two fresh processes with different ``PYTHONHASHSEED``."""
    out = []
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-c", _DIGESTS, *env_ids],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
            env=env,
            check=True,
        )
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def throughput(env_id: str) -> dict[str, Any]:
    """Random valid-action steps per second in this process and through ``llmgym serve`` (one session)."""
    import gymnasium as gym

    from llm_gym.agent.cards import random_episodes, steps_per_second
    from llm_gym.registration import make_env
    from llm_gym.serve.validate import served

    env = make_env(env_id, {})
    local = steps_per_second(env, random_episodes(env_id, IN_PROCESS_STEPS))
    env.close()
    with served([env_id]) as server:
        remote = gym.make("llmgym/Remote-v0", url=server.url, env_id=env_id)
        steps_per_second(remote, random_episodes(env_id, 20, seed=10_000))  # the session warmed up
        served_rate = steps_per_second(remote, random_episodes(env_id, SERVED_STEPS))
        remote.close()
    return {
        "in_process_steps_per_s": round(local, 1),
        "served_steps_per_s": round(served_rate, 1),
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
    }


def without_machine_fields(card: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in card.items() if k not in MACHINE_FIELDS}


def stale(committed: dict[str, Any], fresh: dict[str, dict[str, Any]]) -> list[str]:
    """Families whose committed card differs from ``fresh`` (machine fields aside), and families missing on
    either side."""
    cards = committed.get("cards", {})
    names = sorted(set(cards) | set(fresh))
    return [
        f
        for f in names
        if f not in cards
        or f not in fresh
        or json.loads(json.dumps(without_machine_fields(cards[f]))) != json.loads(json.dumps(fresh[f]))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="only check; exit 1 when a committed card is stale"
    )
    parser.add_argument(
        "--publish", action="store_true", help="also measure the throughput (machine-dependent)"
    )
    args = parser.parse_args(argv)
    committed = json.loads(CARDS.read_text(encoding="utf-8")) if CARDS.exists() else {"cards": {}}
    fresh = deterministic_cards()
    if args.check:
        bad = stale(committed, fresh)
        if bad:
            print(
                f"env cards stale for {', '.join(bad)}: run python scripts/gen_env_cards.py", file=sys.stderr
            )
            return 1
        return 0
    ids = [card["env_id"] for card in fresh.values()]
    first, second = digests_in_subprocesses(ids)
    for family, card in fresh.items():
        env_id = card["env_id"]
        if not first[env_id] == second[env_id] == card["seeding"]["digest"]:
            print(
                f"{env_id}: seed {card['seeding']['seed']} gives different episodes in two processes",
                file=sys.stderr,
            )
            return 1
        old = committed.get("cards", {}).get(family, {})
        if not args.publish and old.get("env_id") == env_id and "throughput" in old:
            card["throughput"] = old["throughput"]
        else:  # --publish, or a new family's card (no throughput to keep)
            card["throughput"] = throughput(env_id)
    out = {
        "generator": "scripts/gen_env_cards.py",
        "cards": fresh,
    }
    CARDS.parent.mkdir(parents=True, exist_ok=True)
    CARDS.write_text(json.dumps(out, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {CARDS.relative_to(ROOT)} ({len(fresh)} cards)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
