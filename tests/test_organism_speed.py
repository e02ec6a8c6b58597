"""``benchmarks/organism_speed.py``: the step plan, and its ``--quick`` mode end to end (tiny model, seconds)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def load_bench():
    sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location("bench_organism_speed", BENCH_DIR / "organism_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_plan_warms_up_both_paths_then_alternates_the_order_of_each_pair():
    bench = load_bench()
    assert bench.plan_steps(0) == ["ours", "plain"]
    assert bench.plan_steps(3) == ["ours", "plain", "plain", "ours", "ours", "plain", "plain", "ours"]


def test_profile_settings_take_the_organism_profile_and_its_lengths_only_for_bandit():
    bench = load_bench()
    fl, bandit = bench.profile_settings("FrozenLake"), bench.profile_settings("Bandit")
    assert fl["num_prompts"] * fl["num_generations"] == 128 and fl["learning_rate"] == 1e-3
    assert "max_completion_length" not in fl and "max_turns" not in fl
    assert fl["one_shot_example"] is False and fl["include_instructions"] is False
    assert bandit["max_completion_length"] == 64 and bandit["one_shot_example"] is False


def test_quick_mode_times_whole_steps_on_each_path(tmp_path, capsys):
    bench = load_bench()
    out = tmp_path / "res.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("organism speed (tiny): FrozenLake ") and "x the probe's 16" in last
    results = json.loads(out.read_text())["results"]
    assert [r["env"] for r in results] == ["FrozenLake", "Bandit"]
    for r in results:
        recs = r["records"]
        assert [x["path"] for x in recs] == bench.plan_steps(1) and [x["step"] for x in recs] == [0, 1, 2, 3]
        for x in recs:
            assert x["episodes"] == r["P"] * r["G"] == 8 and x["generation_s"] > 0 and x["backward_s"] > 0
            assert x["rest_s"] > -0.01  # the timed phases are disjoint parts of the step
            # the switch reached the trainer: ours used the shared pass and the turn cache, plain neither
            used = x["shared_loss_tokens"] > 0 and x["turn_cache_prefill"] > 0
            unused = x["shared_loss_tokens"] == 0 and x["turn_cache_prefill"] == 0
            assert used if x["path"] == "ours" else unused
        for path in bench.PATHS:
            rows = [x for x in recs[2:] if x["path"] == path]
            want = sum(x["episodes"] for x in rows) / sum(x["cpu_s"] for x in rows)
            assert abs(r[path]["episodes_per_cpu_s"] - want) < 1e-9
        assert abs(r["ratio"] - r["ours"]["episodes_per_cpu_s"] / r["plain"]["episodes_per_cpu_s"]) < 1e-9
    fl = results[0]
    assert fl["ours"]["turns_per_episode"] > 1  # multi-turn: the turn cache has turns to carry
