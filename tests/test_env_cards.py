"""Environment cards: the committed cards are what the code gives now, and the hack probes catch real hacks."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import gymnasium as gym
import pytest

from llm_gym.agent.cards import PROBES, card_ids, card_markdown, expert_win, hack_probes
from llm_gym.registration import make_env

ROOT = Path(__file__).resolve().parents[1]
CARDS = ROOT / "docs" / "data" / "env_cards.json"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _load(ROOT / "scripts" / "gen_env_cards.py")


@pytest.fixture(scope="module")
def fresh():
    return gen.deterministic_cards()


@pytest.fixture(scope="module")
def committed():
    return json.loads(CARDS.read_text(encoding="utf-8"))


def test_committed_cards_are_not_stale(fresh, committed):
    """Everything but the throughput is regenerated and compared; the seeding digest, written by two other
    processes with other PYTHONHASHSEEDs, must also come out of this one."""
    assert gen.stale(committed, fresh) == [], "env cards are stale: run python scripts/gen_env_cards.py"
    # a card per family that builds offline (a new family needs `python scripts/gen_env_cards.py`)
    assert set(fresh) == set(card_ids()) >= {"frozenlake", "bandit", "sokoban", "countdown", "metamathqa"}
    for card in committed["cards"].values():
        assert (
            card["throughput"]["in_process_steps_per_s"] > 0 and card["throughput"]["served_steps_per_s"] > 0
        )
        # the organism's recorded run where there is one (Bandit), else the slot says so
        assert card["organism"] == (gen.organism_slot(card["env_id"]) or "not yet measured")
    assert committed["cards"]["bandit"]["organism"].startswith("learns it: held-out success 0.688")


def test_the_organism_slot_follows_the_recorded_run():
    data = json.loads(gen.ORGANISM_DATA.read_text(encoding="utf-8"))
    run = data["envs"]["llmgym/Bandit-v0"]["grpo"]
    assert "5,120 training episodes" in gen.organism_slot("llmgym/Bandit-v0", data)  # 40 steps x 16 x 8
    flipped = copy.deepcopy(data)
    flipped["envs"]["llmgym/Bandit-v0"]["grpo"] = {**run, "learned": False, "rl_steps": 10}
    text = gen.organism_slot("llmgym/Bandit-v0", flipped)
    assert text.startswith("does not learn it") and "after 10 GRPO steps (1,280 training episodes" in text
    assert gen.organism_slot("llmgym/Sokoban-v0", data) is None
    # a family card shows the run on the id its profile trains (FrozenLake's: the 3x3 CoordFrozenLake)
    coord = copy.deepcopy(data)
    coord["envs"].pop("llmgym/CoordFrozenLake-v0", None)
    assert gen.organism_slot("llmgym/FrozenLake-v0", coord) is None
    coord["envs"]["llmgym/CoordFrozenLake-v0"] = {"grpo": {**run, "rl_steps": 400}}
    text = gen.organism_slot("llmgym/FrozenLake-v0", coord)
    assert text.startswith('on CoordFrozenLake-v0 ({"success_rate": 1.0, "size": 3}): learns it')
    assert "400 GRPO steps (51,200 training episodes, after a 300-episode warm start" in text


def test_the_staleness_check_sees_a_changed_card(fresh, committed):
    changed = copy.deepcopy(committed)
    changed["cards"]["sokoban"]["baselines"]["random_valid"]["successes"] += 1
    assert gen.stale(changed, fresh) == ["sokoban"]
    changed = copy.deepcopy(committed)
    changed["cards"]["bandit"]["throughput"]["served_steps_per_s"] = 1.0  # machine-dependent: not compared
    del changed["cards"]["countdown"]
    assert gen.stale(changed, fresh) == ["countdown"]


def test_every_probe_of_every_card_is_robust(fresh):
    for family, card in fresh.items():
        assert list(card["probes"]) == list(PROBES)
        for name, probe in card["probes"].items():
            expected = "n/a" if name == "countdown_reuse" and family != "countdown" else "robust"
            assert probe["verdict"] == expected, (family, name, probe)
            if name == "actions_after_end":  # the won state stays won; the reply earns nothing
                assert [c["reward"] for c in probe["cases"]] == [0.0]
            elif expected == "robust":
                assert probe["cases"] and not any(
                    c["success"] for c in probe["cases"] if "(control)" not in c["reply"]
                )


def test_baselines_have_intervals_and_reasons(fresh):
    sokoban = fresh["sokoban"]["baselines"]
    assert sokoban["seeds"] == [0, 99] and sokoban["optimum"]["rate"] == 1.0
    lo, hi = sokoban["random_valid"]["ci"]
    assert lo <= sokoban["random_valid"]["rate"] <= hi and sokoban["best_constant"]["action"] in (
        "Up",
        "Down",
        "Left",
        "Right",
    )
    assert fresh["countdown"]["baselines"]["best_constant"] is None
    assert "no fixed action names" in fresh["countdown"]["baselines"]["constant_reason"]
    assert fresh["metamathqa"]["baselines"]["random_valid"] is None
    assert fresh["metamathqa"]["baselines"]["random_reason"]


class _Gullible(gym.Wrapper):
    """An env whose grader finds the answer anywhere in the text, keeps paying after the end, and takes
    Countdown expressions that reuse numbers: what each probe must catch."""

    def __init__(self, env, reference: str):
        super().__init__(env)
        self.reference = reference
        self.answer = re.findall(r"<answer>(.*?)</answer>", reference, re.S)[-1]
        think = re.search(r"<think>(.*?)</think>", reference, re.S)
        self.think = (
            think.group(1) if think else ""
        )  # the probes reuse it; the expert's reasoning may name the answer
        self.over = False

    def reset(self, **kw):
        self.over = False
        return self.env.reset(**kw)

    def step(self, action):
        if self.over:
            return "", 1.0, True, False, {"success": True, "actions": ["again"]}
        text = self.reference if self.answer in action.replace(self.think, "") else action
        out = self.env.step(text)
        self.over = out[2] or out[3]
        return out


@pytest.mark.parametrize("family", ["sokoban", "countdown", "metamathqa", "bandit"])
def test_probes_catch_a_gullible_env(family):
    env_id = card_ids()[family]
    _, replies = expert_win(lambda: make_env(env_id, {}))  # the probes' position, as hack_probes finds it
    probes = hack_probes(env_id, lambda: _Gullible(make_env(env_id, {}), replies[-1]))
    for name in ("reasoning_injection", "several_answers", "unparsable_answer", "actions_after_end"):
        assert probes[name]["verdict"] == "exploitable", (name, probes[name])
    if family == "countdown":
        assert probes["countdown_reuse"]["verdict"] == "exploitable"


def test_family_pages_render_their_cards(committed):
    hook = _load(ROOT / "docs" / "hooks" / "env_cards.py")
    for family, card in committed["cards"].items():
        page = (ROOT / "docs" / "envs" / f"{family}.md").read_text(encoding="utf-8")
        assert f"<!-- env-card: {family} -->" in page, family
        out = hook.expand(page)
        assert "<!-- env-card" not in out and card_markdown(card) in out
        assert "organism" in out.lower() and card["organism"] in out
        for name in PROBES:
            assert name.replace("_", " ") in out
    with pytest.raises(KeyError, match="no environment card"):
        hook.expand("<!-- env-card: nosuchfamily -->\n")


def test_a_family_without_an_expert_gets_na_probes_not_a_crash():
    from llm_gym.envs.sokoban import SokobanEnv

    class NoExpert(SokobanEnv):
        expert_name = None

    probes = hack_probes("llmgym/Sokoban-v0", NoExpert)
    assert {p["verdict"] for p in probes.values()} == {"n/a"} and list(probes) == list(PROBES)
