"""benchmarks/learning_study.py --quick: the whole pipeline (training runs, held-out evaluation, baselines,
JSON, PNG, markdown) on the tiny random model."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("learning_study", ROOT / "benchmarks" / "learning_study.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["learning_study"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_quick_mode_writes_results_plot_and_table(tmp_path):
    study = _load()
    out, png, md = tmp_path / "data", tmp_path / "img" / "curve.png", tmp_path / "table.md"
    work = tmp_path / "work"
    res = study.main(
        ["--quick", "--out-dir", str(out), "--png", str(png), "--md", str(md), "--work-dir", str(work)]
    )
    saved = json.loads((out / "learning_study.json").read_text())
    assert saved["settings"]["num_eval_seeds"] == 4 and saved["settings"]["max_steps"] == 1
    assert set(saved["envs"]) == {"FrozenLake", "Bandit"}
    for name, env in saved["envs"].items():
        assert len(env["runs"]) == 2  # two conditions x one seed
        assert {r["condition"] for r in env["runs"]} == {"no_filter", "snr_top_p_0.9"}
        u = env["untrained"]["success"]
        assert u["n"] == 4 and u["ci"][0] <= u["rate"] <= u["ci"][1]
        for r in env["runs"]:
            s = r["after"]["success"]
            assert s["n"] == 4 and s["ci"][0] <= s["rate"] <= s["ci"][1]
            assert [p["step"] for p in r["curve"]] == [0]
            assert r["curve"][0]["episodes"] == 4  # P x G = 2 x 2 training episodes
        # the baseline is the pure module's, on the same held-out seeds and limits
        from llm_gym.agent.baselines import baseline_success

        s = study.SETTINGS[name]
        seeds = list(range(study.HELD_OUT_SEED, study.HELD_OUT_SEED + 4))
        again = baseline_success(
            s.env,
            seeds,
            {**s.env_kwargs, "think": False},
            s.max_turns,
            max_actions_per_turn=s.max_actions_per_turn,
            max_actions=s.max_actions,
        )
        assert env["baseline"] == json.loads(json.dumps(again))
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert (
        "| no_filter, seed 0, after 1 steps |" in text
        and "| untrained |" in text
        and "random valid-action policy" in text
        and "--quick" in text
    )
    assert res["wall_seconds"] > 0


def test_held_out_seeds_never_meet_training_or_pilot_seeds():
    study = _load()
    a = study.parse_args([])
    held = set(range(a.eval_seed, a.eval_seed + a.num_eval_seeds))
    for seed in a.train_seeds:
        base = 10_000 + 1_000 * seed
        train = set(range(base, base + a.max_steps * a.num_prompts))
        assert not held & train
    assert not held & set(range(5000, 5000 + 256))  # pilot evaluation seeds


def test_merge_puts_environments_side_by_side(tmp_path):
    study = _load()
    env = {"setting": {}, "settings": {"max_steps": 1, "train_seeds": [0]}, "baseline": {}, "runs": []}
    a = {"command": "a", "date": "d", "wall_seconds": 1.0, "settings": {}, "envs": {"Bandit": env}}
    b = {"command": "b", "date": "d", "wall_seconds": 2.0, "settings": {}, "envs": {"FrozenLake": env}}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    m = study.merge([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert list(m["envs"]) == ["Bandit", "FrozenLake"] and [s["command"] for s in m["sources"]] == ["a", "b"]
    assert "Command: `a`" in study.header(m) and "Command: `b`" in study.header(m)
    with pytest.raises(SystemExit, match="already"):
        study.merge([str(tmp_path / "a.json"), str(tmp_path / "a.json")])
