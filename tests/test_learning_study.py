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


def _quick(study, work, full):
    """The quick mode: every default run on both environments (slow), or two runs on FrozenLake."""
    if full:
        return (
            study.main(["--quick", "--work-dir", str(work)]),
            list(study.DEFAULT_RUNS),
            {"FrozenLake", "Bandit"},
        )
    runs = ["random:no_filter", "partial:snr_top_p_0.9"]
    return (
        study.main(["--quick", "--work-dir", str(work), "--envs", "FrozenLake", "--runs", *runs]),
        runs,
        {"FrozenLake"},
    )


@pytest.mark.parametrize(
    "full", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["frozenlake", "full"]
)
def test_quick_mode_runs_warm_starts_and_rl_writes_outside_docs_and_resumes(tmp_path, monkeypatch, full):
    study = _load()
    docs = {p: p.stat().st_mtime_ns for p in study.PUBLISHED.values() if p.exists()}
    work = tmp_path / "work"
    res, runs, envs = _quick(study, work, full)
    out = work / "out"
    saved = json.loads((out / "learning_study.json").read_text())
    assert saved["settings"]["num_eval_seeds"] == 4 and saved["settings"]["max_steps"] == 1
    assert set(saved["envs"]) == envs
    for name, env in saved["envs"].items():
        # (a) random warm start -> RL, (b) partial expert warm start -> RL, (c) its SNR-filter variant
        assert [r["condition"] for r in env["runs"]] == runs
        assert set(env["warm_start"]) == {"random seed 0", "partial seed 0"}
        for ws in env["warm_start"].values():
            assert ws["sft"]["steps"] == 1 and ws["eval"]["success"]["n"] == 4
            assert ws["data"]["seeds"][0] >= study.WARM_START_SEED
        assert env["warm_start"]["random seed 0"]["data"]["policies"] == {"random-valid": 4}
        u = env["untrained"]["success"]
        assert u["n"] == 4 and u["ci"][0] <= u["rate"] <= u["ci"][1]
        for r in env["runs"]:
            s = r["after"]["success"]
            assert s["n"] == 4 and s["ci"][0] <= s["rate"] <= s["ci"][1]
            assert [p["step"] for p in r["curve"]] == [0] and r["curve"][0]["episodes"] == 4  # P x G = 2 x 2
            assert r["warm_start"] in env["warm_start"] and r["train_episodes_per_cpu_hour"] > 0
            assert "ws-" in r["argv"]  # RL started from the warm start's model
            assert study.positive(env, r) in (True, False)
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
        if name == "Bandit":
            assert env["constant_actions"] is None
        else:  # the template bar: every constant answer, on the same seeds and limits
            const = env["constant_actions"]
            assert set(const) == {"Left", "Down", "Right", "Up"} and all(c["n"] == 4 for c in const.values())
    png = out / "learning_study.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "learning_study.md").read_text()
    assert (
        "| partial:snr_top_p_0.9, seed 0, after 1 RL steps |" in text
        and "| warm start partial seed 0 (1 SFT steps) |" in text
        and "| untrained |" in text
        and "random valid-action policy" in text
        and "best constant answer (always `" in text
        and "--quick" in text
    )
    assert res["wall_seconds"] > 0
    # nothing was written into docs/
    assert {p: p.stat().st_mtime_ns for p in study.PUBLISHED.values() if p.exists()} == docs
    # resumable by part: a second invocation reuses every finished part (no training happens)
    import llm_gym.trainer.cli as cli
    import llm_gym.trainer.sft as sft

    def refuse(*a, **k):
        raise AssertionError("a finished part ran again")

    monkeypatch.setattr(cli, "main", refuse)
    monkeypatch.setattr(sft, "train_sft", refuse)
    again = _quick(study, work, full)[0]
    assert again["envs"]["FrozenLake"]["runs"] == res["envs"]["FrozenLake"]["runs"]


def test_quick_results_are_never_published():
    study = _load()
    with pytest.raises(SystemExit, match="never published"):
        study.parse_args(["--quick", "--publish"])
    a = study.parse_args(["--runs", "none:no_filter", "expert:snr_top_p_0.9", "no_filter"])
    assert a.run_specs == [("none", "no_filter"), ("expert", "snr_top_p_0.9"), ("none", "no_filter")]
    with pytest.raises(SystemExit, match="RECIPE:FILTER"):
        study.parse_args(["--runs", "clever:no_filter"])


def test_pick_sft_prefers_pilot_success_then_fewer_steps_then_the_smaller_rate(tmp_path):
    study = _load()

    def pilot(name, points, first=5000):
        res = {"eval_seeds": [first, first + 31], "pilots": [
            {"learning_rate": lr, "curve": [{"step": st, "success": {"rate": r}} for st, r in curve]}
            for lr, curve in points.items()]}  # fmt: skip
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(res))
        return str(path)

    a = pilot("a", {1e-4: [(25, 0.2), (50, 0.6), (100, 0.6)], 3e-4: [(25, 0.6), (50, 0.4)]})
    assert study.pick_sft([a])[:2] == (3e-4, 25)  # 0.6 reached first at 25 steps
    b = pilot("b", {5e-5: [(25, 0.6)]})
    assert study.pick_sft([a, b])[:2] == (5e-5, 25)  # full tie: the smaller rate
    held = pilot("held", {1e-4: [(25, 0.9)]}, first=study.HELD_OUT_SEED)
    with pytest.raises(SystemExit, match="below the held-out seeds"):
        study.pick_sft([a, held])


def test_held_out_seeds_never_meet_training_or_pilot_seeds():
    study = _load()
    a = study.parse_args([])
    held = set(range(a.eval_seed, a.eval_seed + a.num_eval_seeds))
    for seed in a.train_seeds:
        base = 10_000 + 1_000 * seed
        train = set(range(base, base + a.max_steps * a.num_prompts))
        assert not held & train
    assert not held & set(range(5000, 5000 + 256))  # pilot evaluation seeds
    for seed in [*a.train_seeds, 7]:  # warm-start data of the study and of the pilots (seed 7)
        first = study.WARM_START_SEED + 1000 * seed
        assert not held & set(range(first, first + a.ws_episodes))


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


def _run(seed, condition, rate):
    ev = {"success": {"rate": rate, "n": 4, "ci": [0.0, 1.0]}}
    return {"seed": seed, "condition": condition, "curve": [], "after": ev}


def test_merge_joins_runs_of_one_environment_split_over_invocations(tmp_path):
    """Two invocations of one study (one per training seed, run in parallel) become one table; the untrained
    evaluation comes from the one that ran it; a different setting or the same run twice is refused."""
    study = _load()
    untrained = {"success": {"rate": 0.1, "n": 4, "ci": [0.0, 0.5]}}

    def inv(name, seed, *, untrained_eval=None, lr=5e-5):
        settings = {"max_steps": 2, "learning_rate": lr, "train_seeds": [seed], "conditions": {"off": []}}
        env = {
            "setting": {"env": "x"},
            "eval_seeds": [1, 4],
            "num_eval_seeds": 4,
            "baseline": {"random": None},
            "constant_actions": None,
        }
        env["runs"] = [_run(seed, "off", 0.25), _run(seed, "snr", 0.5)]
        if untrained_eval is not None:
            env["untrained"] = untrained_eval
        res = {
            "command": name,
            "date": "d",
            "wall_seconds": 1.0,
            "settings": settings,
            "envs": {"Bandit": env},
        }
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(res))
        return str(path)

    first, second = inv("s1", 1), inv("s0", 0, untrained_eval=untrained)
    m = study.merge([first, second])
    env = m["envs"]["Bandit"]
    assert [(r["seed"], r["condition"]) for r in env["runs"]] == [
        (0, "off"),
        (0, "snr"),
        (1, "off"),
        (1, "snr"),
    ]
    assert env["untrained"] == untrained and env["settings"]["train_seeds"] == [0, 1]
    with pytest.raises(SystemExit, match="already in an earlier file: off seed 1, snr seed 1"):
        study.merge([first, first])
    with pytest.raises(SystemExit, match="differs from an earlier file in settings"):
        study.merge([first, inv("lr", 2, lr=1e-4)])


def test_pick_lr_prefers_pilot_success_then_training_success_then_the_smaller_rate(tmp_path):
    study = _load()

    def pilot(lr, after, curve):
        run = _run(0, "no_filter", after)
        run["curve"] = [{"step": i, "success": c} for i, c in enumerate(curve)]
        env = {"runs": [run], "eval_seeds": [5000, 5031]}
        res = {"settings": {"learning_rate": lr, "max_steps": 4}, "envs": {"Bandit": env}}
        path = tmp_path / f"{lr}.json"
        path.write_text(json.dumps(res))
        return str(path)

    low, mid, high = pilot(1e-5, 0.25, [0.1]), pilot(5e-5, 0.5, [0.0]), pilot(2e-4, 0.5, [0.2])
    assert study.pick_lr([low, mid, high])[0] == 2e-4  # tie on pilot success: better training rounds
    assert study.pick_lr([low, mid])[0] == 5e-5
    same = pilot(3e-4, 0.5, [0.2])
    assert study.pick_lr([same, high])[0] == 2e-4  # full tie: the smaller rate
    lr, table = study.pick_lr([low])
    assert lr == 1e-5 and table == [(1e-5, 0.25, 0.1)]
    held_out = json.loads(Path(low).read_text())
    held_out["envs"]["Bandit"]["eval_seeds"] = [study.HELD_OUT_SEED, study.HELD_OUT_SEED + 31]
    Path(low).write_text(json.dumps(held_out))
    with pytest.raises(SystemExit, match="below the held-out seeds"):
        study.pick_lr([low, mid])


def test_only_publish_writes_into_docs(tmp_path):
    # `learning_study.py --quick` (the tested quick mode) used to overwrite the published results in docs/
    study = _load()
    for argv in ([], ["--quick"], ["--quick", "--out-dir", "x"]):
        a = study.parse_args(argv)
        study._output_paths(a, tmp_path)
        assert not any("docs" in Path(p).parts for p in (a.out_dir, a.png, a.md)), (argv, a)
        assert not a.publish
    assert all("docs" in p.parts for p in study.PUBLISHED.values())
    with pytest.raises(SystemExit, match="--quick"):
        study.parse_args(["--quick", "--publish"])
