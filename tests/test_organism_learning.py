"""benchmarks/organism_learning.py's bookkeeping: publishing some parts keeps the others' published sections, and
FrozenLake runs published with the same settings can be taken instead of trained again (no run starts here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(
        "organism_learning_under_test", BENCH / "organism_learning.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    published = tmp_path / "published.json"
    published.write_text((module.PUBLISHED).read_text())
    monkeypatch.setattr(module, "PUBLISHED", published)
    for name in ("part_bandit", "part_held_out", "part_defaults"):
        monkeypatch.setattr(module, name, lambda *a, name=name: pytest.fail(f"{name} ran"))
    return module


def _run(name: str, weight: float, steps: int, rate: float) -> dict:
    rate_ci = {"rate": rate, "ci": [0.0, 1.0], "n": 512}
    return {"format_loss_weight": weight, "steps": steps, "success": rate_ci, "baselines": {"random": rate_ci},
            "sft": {"cpu_seconds": 1.0}}  # fmt: skip


def test_publishing_one_part_keeps_the_other_sections(bench, monkeypatch, tmp_path, capsys):
    before = json.loads(bench.PUBLISHED.read_text())
    runs = {name: _run(name, w, s, 0.5) for name, (w, s) in bench.FL_RUNS.items()}
    control = {"states": 3, "success": {"rate": 0.25, "ci": [0.0, 1.0], "n": 512}, "train_cpu_seconds": 1.0}
    monkeypatch.setattr(bench, "part_frozenlake_sft", lambda *a: runs)
    monkeypatch.setattr(bench, "part_frozenlake_control", lambda *a: control)
    assert bench.main(["--work-dir", str(tmp_path / "w"), "--parts", "frozenlake", "--publish"]) == 0
    after = json.loads(bench.PUBLISHED.read_text())
    assert after["envs"] == before["envs"] and after["defaults"] == before["defaults"]
    assert after["frozenlake_sft"]["runs"] == runs and after["frozenlake_sft"]["control"] == control
    assert "vs control: 2.00x" in capsys.readouterr().out


def test_unknown_parts_are_a_usage_error(bench, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--work-dir", str(tmp_path / "w"), "--parts", "frozenlake,sokoban"])
    assert "unknown sokoban" in capsys.readouterr().err


def test_published_runs_are_reused_only_with_the_same_settings(bench, monkeypatch, tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    (work / "frozenlake_solver.jsonl").write_text("{}\n")
    started: list[str] = []

    def timed(cmd, log):
        started.append(Path(log).name)
        raise RuntimeError("a run started")

    monkeypatch.setattr(bench, "_timed", timed)
    published = {name: _run(name, w, s, 0.1) for name, (w, s) in bench.FL_RUNS.items()}
    assert bench.part_frozenlake_sft(work, False, published) == published
    assert not started
    stale = dict(published)
    stale["w0.1_600"] = _run("w0.1_600", 0.1, 300, 0.1)  # published with other steps: trained again
    for f in work.glob("frozenlake_sft_*.json"):
        f.unlink()
    with pytest.raises(RuntimeError, match="a run started"):
        bench.part_frozenlake_sft(work, False, stale)
    assert started == ["frozenlake_sft_w0.1_600.log"]


def _ci(rate: float, lo: float, hi: float) -> dict:
    return {"rate": rate, "ci": [lo, hi], "n": 512}


def _fake_profile_run(monkeypatch, bench, after: dict, constants: dict | None):
    """``_timed`` replaced by a run that only writes the eval report llmgym-train would."""

    def timed(cmd, log):
        out = Path(cmd[cmd.index("--output_dir") + 1])
        out.mkdir(parents=True)
        ws = _ci(0.6, 0.55, 0.65)
        evals = [
            {"step": 0, "success": ws, "valid": ws},
            {"step": 400, "success": after, "valid": after, "success_given_valid": after},
        ]
        report = {
            "seeds": [200000, 200511],
            "evals": evals,
            "warm_start": {"base": {"success": _ci(0.0, 0.0, 0.01)}},
            "baseline": {"random": _ci(0.2, 0.17, 0.24), "optimum": _ci(0.9, 0.88, 0.93)},
            "constant_actions": constants,
        }
        (out / "eval_report.json").write_text(json.dumps(report))
        return {"wall_seconds": 1.0, "cpu_seconds": 1.0}

    monkeypatch.setattr(bench, "_timed", timed)


def test_a_profile_run_is_judged_against_its_warm_start_random_and_the_best_constant(
    bench, monkeypatch, tmp_path
):
    constants = {"Left": _ci(0.1, 0.08, 0.13), "Down": _ci(0.3, 0.26, 0.34)}
    _fake_profile_run(monkeypatch, bench, _ci(0.75, 0.71, 0.79), constants)
    run = bench.part_profile(tmp_path / "a", False, "coordfrozenlake")
    assert run["command"] == "llmgym-train --profile organism --env CoordFrozenLake"
    assert run["baselines"]["best_constant"]["action"] == "Down" and run["learned"]
    assert json.loads((tmp_path / "a" / "coordfrozenlake.json").read_text()) == run  # resumable: saved whole
    # inside the warm start's interval: not learned, however far above random
    _fake_profile_run(monkeypatch, bench, _ci(0.66, 0.62, 0.70), constants)
    assert not bench.part_profile(tmp_path / "b", False, "coordfrozenlake")["learned"]
    # above the warm start but not the best constant answer: not learned either
    _fake_profile_run(monkeypatch, bench, _ci(0.75, 0.71, 0.79), {"Down": _ci(0.8, 0.76, 0.84)})
    assert not bench.part_profile(tmp_path / "c", False, "coordfrozenlake")["learned"]
    # Bandit has no constant answer: the reason is recorded instead
    _fake_profile_run(monkeypatch, bench, _ci(0.75, 0.71, 0.79), None)
    bandit = bench.part_profile(tmp_path / "d", False, "bandit")
    assert (
        bandit["baselines"]["best_constant"] is None
        and "no constant answer" in bandit["baselines"]["best_constant_reason"]
    )
