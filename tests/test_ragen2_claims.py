"""benchmarks/ragen2_claims.py without training: its statistics, the summary of a run folder, the aggregation over
finished parts (``--aggregate-only``), the quick path writing nothing into docs/, and the docs hook's tables."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rc():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return _load("ragen2_claims", ROOT / "benchmarks" / "ragen2_claims.py")


@pytest.fixture(scope="module")
def hook():
    return _load("_docs_hook_ragen2_claims", ROOT / "docs" / "hooks" / "ragen2_claims.py")


# ------------------------------------------------------------------------------------------ statistics
def test_spearman_and_ranks(rc):
    assert rc.rankdata([3.0, 1.0, 3.0, 2.0]).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert rc.spearman([1, 2, 3, 4], [10, 20, 35, 100]) == pytest.approx(1.0)
    assert rc.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # x = 1..5, y ranks 2,1,4,3,5: 1 - 6 * 4 / (5 * 24) = 0.8
    assert rc.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # pairs with a missing or non-finite side are left out; too few pairs or a constant side give None
    assert rc.spearman([1, 2, None, 3, 4], [1, 2, 5, math.nan, 3]) == pytest.approx(1.0)
    assert rc.spearman([1, 2], [1, 2]) is None and rc.spearman([1, 1, 1], [1, 2, 3]) is None


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=3, max_size=30))
def test_spearman_is_invariant_under_monotone_maps(xs):
    ys = [x**3 + 2 * x for x in xs]  # strictly increasing in x
    rho = rc_module().spearman(xs, ys)
    if len(set(xs)) > 1:
        assert rho == pytest.approx(1.0)


def rc_module():
    return sys.modules["ragen2_claims"]


def test_bootstrap_interval_of_the_mean(rc):
    assert rc.bootstrap_ci([0.5]) is None and rc.bootstrap_ci([]) is None
    assert rc.bootstrap_ci([0.3, 0.3, 0.3]) == [0.3, 0.3]
    values = [0.2, 0.4, 0.6, 0.8, 0.5, 0.7]
    lo, hi = rc.bootstrap_ci(values)
    assert lo < np.mean(values) < hi and 0.2 <= lo and hi <= 0.8
    assert rc.bootstrap_ci(values) == [lo, hi]  # fixed stream: the same interval every time


def test_steps_to_threshold_reads_the_trailing_mean_and_the_pilot_sets_half_its_gain(rc):
    success = [0.0] * 5 + [1.0] * 10
    # trailing 5-step mean reaches 0.6 at the third 1.0 (step 8 when steps start at 1)
    assert rc.steps_to(list(range(1, 16)), success, 0.6) == 8
    assert rc.steps_to(list(range(1, 16)), success, 1.5) is None
    assert rc.trailing_mean([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]
    # two pilots from 0.4 to 0.8 and 0.2 to 0.6: start 0.3, peak 0.7, half the gain 0.5
    curves = [[0.4] * 5 + [0.8] * 5, [0.2] * 5 + [0.6] * 5]
    assert rc.pilot_threshold(curves) == 0.5
    # a pilot that collapses after its peak still counts its peak
    assert rc.pilot_threshold([[0.4] * 5 + [0.8] * 5 + [0.0] * 10]) == 0.6


def test_collapse_onset_is_the_round_from_which_valid_answers_stay_gone(rc):
    assert rc.collapse_step([1, 2, 3, 4], [0.9, None, 0.04, 0.0]) == 3
    assert rc.collapse_step([1, 2, 3, 4, 5], [0.9, 0.0, 0.6, 0.05, 0.01]) == 4  # the dip at 2 recovered
    assert (
        rc.collapse_step([1, 2, 3], [0.9, 0.0, 0.5]) is None and rc.collapse_step([1, 2], [0.9, 0.5]) is None
    )
    assert rc.dipped([0.9, 0.0, 0.5]) and not rc.dipped([0.9, None, 0.5])


def _episode(seed: int, arms: tuple[str, str], chosen: str | None, mode: str = "eval", step: int = 3) -> dict:
    return {
        "seed": seed,
        "initial_observation": f"The two arms are: {arms[0]} and {arms[1]}. Which arm do you pull?",
        "turns": [{"info": {"chosen_arm": chosen}}],
        "meta": {"mode": mode, "step": step},
        "success": chosen == arms[0],
    }


def test_answer_statistics_tell_a_template_from_an_input_dependent_policy(rc):
    pairs = [("Pilot", "Postman"), ("Miner", "Clerk"), ("Diver", "Banker"), ("Racer", "Tailor")]
    reading = [
        _episode(i, p, p[0]) for i, p in enumerate(pairs * 4)
    ]  # answers the first arm: depends on input
    s = rc.answer_stats(reading)
    assert s["episodes"] == 16 and s["distinct_answers"] == 4 and s["top_answer_share"] == 0.25
    assert s["answer_mi_bits"] == pytest.approx(2.0) and s["first_listed_share"] == 1.0
    template = [_episode(i, p, "Pilot" if p[0] == "Pilot" else None) for i, p in enumerate(pairs * 4)]
    s = rc.answer_stats(template)  # one name whatever is shown (invalid elsewhere)
    assert s["top_answer_share"] == 0.75 and s["answer_mi_bits"] == pytest.approx(
        s["answer_entropy_bits"]
    )  # the answer is a function of the context here, so MI equals H(answer): 0.81 bits < 2
    constant = [_episode(i, p, None) for i, p in enumerate(pairs * 4)]
    s = rc.answer_stats(constant)
    assert s["top_answer_share"] == 1.0 and s["answer_mi_bits"] == 0.0 and math.isnan(s["first_listed_share"])
    assert rc.answer_stats([]) == {"episodes": 0}


def test_concentration_of_answers_over_contexts(rc):
    # the answer copies the context: all of H(answer) is information about the context
    copy = rc.concentration([("a", "x"), ("b", "y"), ("a", "x"), ("b", "y")])
    assert copy == {"top_share": 0.5, "distinct": 2, "entropy_bits": 1.0, "mi_bits": 1.0}
    # one answer whatever the context: no information, fully concentrated
    template = rc.concentration([("a", "x"), ("b", "x"), ("c", "x")])
    assert template["top_share"] == 1.0 and template["mi_bits"] == 0.0 and template["entropy_bits"] == 0.0
    # an answer independent of the context: entropy 1 bit, MI 0
    noise = rc.concentration([("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")])
    assert noise["entropy_bits"] == 1.0 and noise["mi_bits"] == pytest.approx(0.0)


def _board(start: tuple[int, int], goal: tuple[int, int]) -> str:
    return (
        "Coordinates:\nBoard: 3 rows x 3 cols (zero-indexed, (row, col))\n"
        f"Start: ({start[0]}, {start[1]})\nGoal: ({goal[0]}, {goal[1]})\nPlayer: ({start[0]}, {start[1]})\n"
        "Holes: none\nGrid Map:\n___\n___\n___"
    )


def _fl_episode(seed: int, start, goal, move: str | None, mode: str = "eval", step: int = 3) -> dict:
    valid = move is not None
    return {
        "seed": seed,
        "initial_observation": _board(start, goal),
        "turns": [{"info": {"action_is_valid": valid, "actions": [move] if valid else []}}],
        "meta": {"mode": mode, "step": step},
        "success": False,
    }


def test_goal_direction_is_read_from_the_board(rc):
    assert rc.goal_direction(_board((0, 2), (2, 2))) == (1, 0)
    assert rc.goal_direction(_board((1, 1), (0, 0))) == (-1, -1)
    assert rc.goal_direction("Goal: (1, 1)") is None and rc.goal_direction("") is None


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=400))
def test_goal_direction_never_raises_on_arbitrary_text(text):
    d = rc_module().goal_direction(text)
    assert d is None or (d[0] in (-1, 0, 1) and d[1] in (-1, 0, 1))


def test_move_statistics_tell_a_template_from_a_board_reading_policy(rc):
    boards = [((0, 0), (2, 0)), ((0, 0), (0, 2)), ((2, 2), (0, 2)), ((2, 2), (2, 0))]
    reading = [
        _fl_episode(
            i,
            s,
            g,
            {(1, 0): "Down", (0, 1): "Right", (-1, 0): "Up", (0, -1): "Left"}[
                rc.goal_direction(_board(s, g))
            ],
        )
        for i, (s, g) in enumerate(boards * 2)
    ]
    m = rc.move_stats(reading)
    assert m["episodes"] == 8 and m["distinct_moves"] == 4 and m["top_move_share"] == 0.25
    assert m["move_mi_bits"] == pytest.approx(2.0) and m["toward_goal_share"] == 1.0
    template = [_fl_episode(i, s, g, "Down") for i, (s, g) in enumerate(boards * 2)]
    m = rc.move_stats(template)
    assert m["top_move_share"] == 1.0 and m["move_mi_bits"] == 0.0 and m["toward_goal_share"] == 0.25
    invalid = [_fl_episode(i, s, g, None) for i, (s, g) in enumerate(boards)]
    m = rc.move_stats(invalid)
    assert m["distinct_moves"] == 1 and math.isnan(m["toward_goal_share"])
    assert rc.move_stats([]) == {"episodes": 0}


# ------------------------------------------------------------------------------------------ a run folder
def _write_run(folder: Path, rate: float, *, seed: int, steps: int = 12, frozenlake: bool = False) -> None:
    """A finished run folder as llmgym-train writes it: eval report, collapse series (with MI every 5 steps and
    a gradient analysis on step 1 and 11) and episode records (training rounds and the final evaluation)."""
    folder.mkdir(parents=True)
    n = 20
    ok = round(rate * n)

    def s(k: int) -> dict:
        return {"successes": k, "n": n, "rate": k / n, "ci": [max(k / n - 0.2, 0.0), min(k / n + 0.2, 1.0)]}

    report = {
        "evals": [
            {"step": 0, "success": s(8), "valid": s(16)},
            {"step": steps, "success": s(ok), "valid": s(n), "success_given_valid": s(ok)},
        ]
    }
    (folder / "eval_report.json").write_text(json.dumps(report))
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, steps + 1):
        succ = min(1.0, 0.4 + step * (rate - 0.4) / steps + rng.normal(0, 0.02))
        r = {
            "step": step,
            "env/success": succ,
            "env/valid_action_rate": 0.9,
            "step_time": 1.0 + rng.random() * 0.1,
            "snr/kept_frac": 0.7,
            "snr/group_var_cv": 0.8,
            "snr/filter_seconds": 0.0005,
            "entropy": 1.0 - 0.5 * succ,
        }
        if step % 5 == 1:
            r |= {
                "mi/trajectory/mi_zscore": succ + rng.normal(0, 0.01),
                "mi/trajectory/retrieval_acc": succ / 2,
                "mi/first_turn/mi_zscore": succ,
                "mi/trajectory/cond_entropy": 2 - succ,
            }
        if step in (1, 11):
            for b in (1, 2, 3):
                rv = 0.1 * (b - 1)
                r[f"grad_analysis/bucket_{b}/sqrt_reward_var"] = rv
                r[f"grad_analysis/bucket_{b}/task_norm"] = 2.0 * rv
            r["grad_analysis/seconds"] = 0.3
        rows.append(r)
    (folder / "collapse.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if frozenlake:  # goal below or to the right of the start; the policy always moves down
        boards = [((0, 0), (2, 0)), ((0, 0), (0, 2))]
        eps = [_fl_episode(i, *boards[i % 2], "Down", "train", 0) for i in range(8)]
        eps += [_fl_episode(100 + i, *boards[i % 2], "Down", "eval", steps) for i in range(6)] * 2
    else:
        pairs = [("Pilot", "Postman"), ("Miner", "Clerk")]
        eps = [_episode(i, pairs[i % 2], pairs[i % 2][0], "train", 0) for i in range(8)]
        # the final step's periodic and closing evaluations hold the same seeds: counted once
        eps += [_episode(100 + i, pairs[i % 2], pairs[i % 2][i % 2], "eval", steps) for i in range(6)] * 2
    (folder / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))


def _part(
    rc, work: Path, cell, seed: int, rate: float, pilot: bool = False, study=None, cpu: float = 30.0
) -> dict:
    study = study or rc.BANDIT
    name = ("pilot_" if pilot else "") + rc.run_name(cell, seed, study)
    folder = work / "runs" / name
    _write_run(folder, rate, seed=seed, frozenlake=study is rc.FROZENLAKE)
    part = {
        "name": name,
        "env": study.env,
        "cell": cell.key,
        "arm": cell.arm,
        "beta": cell.beta,
        "entropy_coef": cell.entropy,
        "seed": seed,
        "pilot": pilot,
        "cpu_seconds": cpu,
        "wall_seconds": 40.0,
        **rc.summarise_run(folder, study.collapse_stats),
    }
    (work / "runs" / f"{name}.json").write_text(json.dumps(part))
    return part


def test_a_run_folder_is_summarised(rc, tmp_path):
    _write_run(tmp_path / "r", 0.7, seed=0)
    s = rc.summarise_run(tmp_path / "r")
    assert s["after"]["success"]["rate"] == 0.7 and s["warm_start"]["success"]["rate"] == 0.4
    assert s["steps"] == list(range(1, 13)) and len(s["series"]["env/success"]) == 12
    assert [c["step"] for c in s["checkpoints"]] == [1, 6, 11]
    assert len(s["grad"]) == 6 and {g["bucket"] for g in s["grad"]} == {1, 2, 3}
    # plain step time leaves out the MI and gradient-analysis rounds
    assert 1.0 <= s["step_time_plain"] <= 1.1 and s["filter_cost_share"] == pytest.approx(0.0005, rel=0.1)
    final = s["collapse"]["final_eval"]
    assert final["episodes"] == 6 and final["first_listed_share"] == pytest.approx(0.5)
    assert [t["step"] for t in s["collapse"]["train"]] == [0]


# ------------------------------------------------------------------------------------------ aggregation and main
def test_aggregate_only_quick_writes_the_work_dir_and_nothing_into_docs(
    rc, hook, tmp_path, monkeypatch, capsys
):
    published, plots = tmp_path / "docs" / "ragen2_claims.json", tmp_path / "docs" / "img"
    monkeypatch.setattr(rc, "PUBLISHED", published)
    monkeypatch.setattr(rc, "PLOTS", plots)
    work = tmp_path / "work"
    rates = {"off": (0.5, 0.6), "top_p": (0.7, 0.8), "upstream_top_p": (0.6, 0.6)}  # top_k not run
    for arm, (a, b) in rates.items():
        _part(rc, work, rc.Cell(arm), 0, a)
        _part(rc, work, rc.Cell(arm), 1, b)
    _part(rc, work, rc.Cell("off"), 100, 0.8, pilot=True)
    # FrozenLake: both core arms on seed 0, no filter on seed 1, and its own pilot run
    _part(rc, work, rc.Cell("top_p"), 100, 0.7, pilot=True, study=rc.FROZENLAKE)
    _part(rc, work, rc.Cell("off"), 0, 0.5, study=rc.FROZENLAKE)
    _part(rc, work, rc.Cell("off"), 1, 0.6, study=rc.FROZENLAKE)
    _part(rc, work, rc.Cell("top_p"), 0, 0.65, study=rc.FROZENLAKE, cpu=15.0)
    (work / "runs" / "broken.json").write_text("{")  # a torn part is skipped, not fatal
    assert rc.main(["--work-dir", str(work), "--quick", "--aggregate-only"]) == 0
    assert not published.exists() and not plots.exists()
    result = json.loads((work / "ragen2_claims.json").read_text())
    arms = result["envs"][rc.ENV]
    assert arms["off"]["seeds"] == [0, 1] and arms["off"]["success"]["mean"] == pytest.approx(0.55)
    assert arms["top_p"]["success"]["ci"][0] <= 0.75 <= arms["top_p"]["success"]["ci"][1]
    assert arms["top_p"]["delta_vs_no_filter"]["mean"] == pytest.approx(0.2)  # paired by seed
    bandit = result["per_env"][rc.ENV]
    assert arms["top_k"]["seeds"] == [] and bandit["missing"] == {"top_k": [0, 1]}
    # runs_done and runs_planned count both envs; per_env holds each env's summary, and only there
    assert not {"missing", "pilot", "gradient", "when_filter_helps"} & result.keys()
    assert result["runs_done"] == 9 and result["runs_planned"] == 12
    assert result["per_env"][rc.ENV]["runs_done"] == 6 and result["per_env"][rc.ENV]["runs_planned"] == 8
    fl, fl_sum = result["envs"][rc.FL_ENV], result["per_env"][rc.FL_ENV]
    assert fl["off"]["seeds"] == [0, 1] and fl["off"]["success"]["mean"] == pytest.approx(0.55)
    assert fl["top_p"]["delta_vs_no_filter"]["mean"] == pytest.approx(0.15)  # paired: seed 0 only
    assert fl["top_p"]["cpu_vs_no_filter"] == pytest.approx(0.5) and fl["off"]["cpu_vs_no_filter"] is None
    assert fl_sum["missing"] == {"top_p": [1]} and fl_sum["runs_done"] == 3 and fl_sum["runs_planned"] == 4
    # each env's threshold comes from its own pilot runs, which count toward neither env's runs
    assert fl_sum["pilot"]["seeds"] == [100] and fl_sum["pilot"]["cells"] == ["top_p"]
    assert 0.4 < fl_sum["pilot"]["threshold"] < 0.8 and "pilot_fl_top_p_s100" in fl_sum["pilot"]["success"]
    # the policy always moves down: one move, no information about the goal, toward the goal half the time
    c = fl["off"]["collapse"]
    assert c["top_move_share"] == 1.0 and c["move_mi_bits"] == 0.0 and c["toward_goal_share"] == 0.5
    assert fl_sum["spearman"]["mi"]["rho"] > 0.8 and {"mi", "entropy"} <= result["spearman"].keys()
    assert bandit["pilot"]["seeds"] == [100] and 0.4 < bandit["pilot"]["threshold"] < 0.8
    # MI tracks success in these runs, entropy falls with it
    assert result["spearman"]["mi"]["rho"] > 0.8 and result["spearman"]["entropy"]["rho"] < -0.8
    assert result["spearman"]["mi"] == bandit["spearman"]["mi"] and result["spearman"]["env"] == rc.ENV
    assert (
        bandit["gradient"]["c_max"] == pytest.approx(2.0) == bandit["gradient"]["c_p95"]
        and bandit["gradient"]["zero_rv_points"] == 12
    )
    assert [r["setting"] for r in result["ragen2_table8"]] == [r["setting"] for r in rc.TABLE8]
    out = capsys.readouterr().out
    assert "top_p: success 0.750" in out and "runs done 6 of 8" in out and "runs done 3 of 4" in out
    # the docs tables render from it
    text = hook.expand(
        "\n\n".join(f"<!-- ragen2-claims-{n} -->" for n in hook.RENDERERS), work / "ragen2_claims.json"
    )
    assert (
        "<!--" not in text
        and "**0.750**" in text
        and "`top_k` | 0 of 2 | not run" in text
        and "One analysis took 0.30 s" in text
    )
    assert (
        "**Missing:** `top_k` seeds 0, 1" in text
        and "RAGEN-2 Table 8: FrozenLake 3B GRPO | 0.33 | -5.0" in text
    )
    # FrozenLake's tables: its arms (the seed-0 pair), its first-move columns, its missing seed, its Table 8 row
    assert "| `top_p` | 1 | **0.650** | +0.150 |" in text and "| `off` | 1.000 | 0.00 | 0.50 |" in text
    assert "FrozenLake, 3 of 4 planned runs" in text and "**Missing:** `top_p` seeds 1" in text
    assert "| organism FrozenLake, `top_p` |" in text
    assert "on one round in 10)" in text and "on one round in 25)" in text  # each env's own analysis interval


def test_plots_are_drawn_per_env_with_finished_runs(rc, tmp_path):
    work = tmp_path / "work"
    for seed in (0, 1):
        _part(rc, work, rc.Cell("off"), seed, 0.5 + 0.1 * seed)
        _part(rc, work, rc.Cell("top_p"), seed, 0.6, study=rc.FROZENLAKE)
    pilot, runs = rc.load_runs(work)
    paths = rc.plot(rc.aggregate(pilot, runs), pilot, runs, tmp_path / "img")
    names = sorted(p.name for p in paths)
    assert names == sorted(
        f"ragen2_claims_{n}{tag}.png"
        for n in ("success", "curves", "gradient", "spearman")
        for tag in ("", "_frozenlake")
    )
    assert all(p.stat().st_size > 1000 for p in paths)


def test_quick_is_never_published(rc, tmp_path):
    with pytest.raises(SystemExit):
        rc.main(["--work-dir", str(tmp_path), "--quick", "--publish"])
    with pytest.raises(SystemExit):
        rc.main(["--work-dir", str(tmp_path), "--stages", "core,nope", "--aggregate-only"])
    assert not (tmp_path / "ragen2_claims.json").exists()


def test_frozenlake_plan_puts_the_core_arms_first_with_ten_seeds_and_disjoint_env_seeds(rc):
    plan = rc.planned(quick=False, study=rc.FROZENLAKE)
    core = [(c.key, s) for stage, c, s in plan if stage == "fl_core"]
    assert plan[: len(core)] == [("fl_core", rc.Cell(k), s) for k, s in core]  # before top-k and upstream
    assert sorted(core) == sorted((k, s) for k in ("off", "top_p") for s in range(10))
    assert [k for k, _ in core[:4]] == [
        "off",
        "top_p",
        "off",
        "top_p",
    ]  # seed-major: a cut leaves equal seeds
    # every FrozenLake stage at the 10 seeds per arm, the crossings last
    assert [st for st in rc.FL_STAGES] == ["fl_core", "fl_more", "fl_kl", "fl_entropy", "fl_kl04"]
    assert all(seeds == tuple(range(10)) for _, seeds in rc.FL_STAGES.values())
    assert {c.key for c in rc.FL_STAGES["fl_kl"][0]} == {"off+kl0.01", "top_p+kl0.01"}
    assert {c.key for c in rc.FL_STAGES["fl_entropy"][0]} == {"off+ent0.001", "top_p+ent0.001"}
    assert {c.key for c in rc.FL_STAGES["fl_kl04"][0]} == {"off+kl0.04", "top_p+kl0.04"}
    fl = rc.FROZENLAKE
    seeds = [*range(10), *fl.pilot_seeds]
    train = [set(range(fl.train_seed(s), fl.train_seed(s) + 16 * fl.steps)) for s in seeds]
    assert all(not (a & b) for i, a in enumerate(train) for b in train[i + 1 :])
    everything = set().union(*train)
    evals = set(range(rc.EVAL_SEED, rc.EVAL_SEED + rc.EVAL_N))
    pilot_evals = set(range(rc.PILOT_EVAL_SEED, rc.PILOT_EVAL_SEED + fl.pilot_eval_n))
    # organism_learning.py's solver episodes (the warm start's data)
    solver = set(range(rc.ol.FL_SOLVER_SEED, rc.ol.FL_SOLVER_SEED + rc.ol.FL_SOLVER_EPISODES))
    assert not (everything & evals) and not (everything & pilot_evals) and not (everything & solver)
    assert {c.key for c in fl.pilot_cells} == {"off", "top_p"} and not set(fl.pilot_seeds) & set(range(10))
    assert rc.run_name(rc.Cell("off"), 3, fl) == "fl_off_s3" and rc.run_name(rc.Cell("off"), 3) == "off_s3"
    quick = rc.planned(quick=True, study=fl)
    assert {s for _, _, s in quick} == set(rc.QUICK_SEEDS) and {st for st, _, _ in quick} == {"fl_core"}


def test_frozenlake_warm_start_is_copied_once_from_a_given_folder(rc, tmp_path):
    given = tmp_path / "ckpt"
    given.mkdir()
    (given / "config.json").write_text("{}")
    (given / "model.safetensors").write_bytes(b"w")
    got = rc.fl_warm_start(tmp_path / "work", quick=True, given=given)
    assert (
        got == tmp_path / "work" / "frozenlake_warm_start" / "final"
        and (got / "model.safetensors").read_bytes() == b"w"
    )
    (given / "model.safetensors").write_bytes(b"changed")  # a finished copy is kept, never refreshed
    assert rc.fl_warm_start(tmp_path / "work", quick=True, given=given) == got
    assert (got / "model.safetensors").read_bytes() == b"w"


def test_the_plan_covers_every_arm_with_ten_seeds_and_disjoint_seed_sets(rc):
    plan = rc.planned(quick=False)
    core = {(c.key, s) for stage, c, s in plan if stage == "core"}
    assert {k for k, _ in core} == set(rc.ARMS) and len(core) == 10 * len(rc.ARMS)
    train = {
        rc.train_seed(s) + i
        for s in {s for _, _, s in plan} | set(rc.PILOT_SEEDS)
        for i in range(16 * rc.STEPS)
    }
    evals = set(range(rc.EVAL_SEED, rc.EVAL_SEED + rc.EVAL_N))
    pilot_evals = set(range(rc.PILOT_EVAL_SEED, rc.PILOT_EVAL_SEED + rc.PILOT_EVAL_N))
    assert not (train & evals) and not (train & pilot_evals) and not (evals & pilot_evals)
    # no two training seeds share env seeds
    assert rc.train_seed(1) - rc.train_seed(0) >= 16 * rc.STEPS


def test_the_published_tables_render_when_recorded(hook):
    if not hook.DATA.is_file():
        pytest.skip("docs/data/ragen2_claims.json not published yet")
    data = json.loads(hook.DATA.read_text())
    text = hook.expand("<!-- ragen2-claims-arms -->\n")
    for key, a in data["envs"][hook.ENV].items():
        if a["seeds"]:
            assert f"| `{key}` | {len(a['seeds'])} | **{a['success']['mean']:.3f}**" in text
    assert {"mi", "entropy"} <= data["spearman"].keys()
    fl = hook.expand("<!-- ragen2-claims-fl-arms -->\n")
    for key, a in data["envs"].get(hook.FL_ENV, {}).items():
        if a.get("seeds"):
            assert f"| `{key}` | {len(a['seeds'])} | **{a['success']['mean']:.3f}**" in fl
