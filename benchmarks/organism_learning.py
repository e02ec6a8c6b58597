"""Does RL through llmgym-train learn? The model organism on Bandit, against random play and its own warm start.

Parts, each saved in ``--work-dir`` as it finishes (rerunning the same command skips finished parts):

* ``bandit``: the README's main job, ``llmgym-train --profile organism --env Bandit`` (a 0.9M-parameter organism
  built from scratch, a format-only warm start, 40 GRPO steps of 16 x 8 episodes), timed (wall and CPU seconds);
  evaluated on 512 held-out seeds before and after, beside random valid arms.
* ``bandit_held_out``: the warm start and the RL model on ``llmgym/BanditHeldOut-v0`` (8 arm-name pairs never
  trained on), to say whether what RL learned generalises beyond the 12 training pairs.
* ``frozenlake_sft_*`` (part ``frozenlake``): the sample-efficiency gap. ``llmgym-sft`` trains ``organism-s`` on
  3x3 CoordFrozenLake solver episodes (seeds 1,000,000.., steps of 32 episodes, lr 1e-3 constant) with the loss
  on every reply token alike (TRL's loss, 300 steps) and with the format tokens weighed 0.1
  (``--format_loss_weight``, 300, 600 and 900 steps), each evaluated greedily on 512 held-out seeds (200,000..) beside
  random valid moves and the optimum; ``frozenlake_control``: the plain-PyTorch control
  (``benchmarks/plain_control.py``) trained on every move of the same episodes and played on the same seeds.
* ``coordfrozenlake``: multi-turn RL, ``llmgym-train --profile organism --env CoordFrozenLake`` (organism-s, an
  expert warm start of 300 SFT steps that reads the board, then 400 GRPO steps of 16 x 8 three-turn episodes),
  timed, evaluated greedily on 512 held-out seeds (200,000..) for the base model, the warm start and after RL, beside
  random valid moves, the best constant move and the optimum.
* ``defaults_*``: RL from the same warm start with the grpo preset's entropy bonus (0.001) and per-group reward
  scaling, alone and together, against neither: the measurement behind the recommended defaults.

The result, ``organism_learning.json``, holds per env and run ``warm_start`` and ``after`` (each with
``success.ci``), ``baselines.random.ci``, ``baselines.best_constant`` (``null`` with the reason where an env has
none) and ``num_eval_seeds``; the run's ``eval_report.json``, learning curve and episode GIF are in its folder.
``--publish`` copies it to ``docs/data/`` (never with ``--quick``), where scripts/gen_readme.py reads the README's
main-job table from it, and each profile run's learning curve to ``docs/img/organism_<part>_learning_curve.png``.

    OMP_NUM_THREADS=1 python benchmarks/organism_learning.py --work-dir /tmp/ol --publish
    OMP_NUM_THREADS=1 python benchmarks/organism_learning.py --work-dir /tmp/ol --parts frozenlake --publish \\
        --reuse-published   # the FrozenLake comparison alone, runs published with the same settings kept
    OMP_NUM_THREADS=1 python benchmarks/organism_learning.py --work-dir /tmp/ol --parts coordfrozenlake --publish
    OMP_NUM_THREADS=1 python benchmarks/organism_learning.py --quick --work-dir /tmp/ol_quick   # ~1 CPU-minute
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline, single-threaded)
from learning_study import SETTINGS  # noqa: E402

from llm_gym.agent.baselines import format_rate  # noqa: E402

_FROZENLAKE = SETTINGS["FrozenLake"]

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "docs" / "data" / "organism_learning.json"
IMG = ROOT / "docs" / "img"
#: The organism profiles run here, part name -> ``--env`` (``bandit`` is the README's main job).
PROFILE_ENVS = {"bandit": "Bandit", "coordfrozenlake": "CoordFrozenLake"}
QUICK = [
    "--warm_start_max_steps",
    "10",
    "--warm_start_episodes",
    "64",
    "--max_steps",
    "2",
    "--num_eval_seeds",
    "16",
]
HELD_OUT_ENV = "llmgym/BanditHeldOut-v0"


def _bin(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    return found or name


def _timed(cmd: list[str], log: Path) -> dict[str, float]:
    """Run ``cmd`` with its output in ``log``; wall and CPU seconds (user + system of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {code}); see {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1)}


def profile_job(short: str) -> list[str]:
    """The organism profile's one command for an env (``trainer/profiles/organism/<short>.yaml``)."""
    return ["llmgym-train", "--profile", "organism", "--env", PROFILE_ENVS[short]]


#: The README's main job, exactly as printed there.
MAIN_JOB = profile_job("bandit")


def part_profile(work: Path, quick: bool, short: str = "bandit") -> dict[str, Any]:
    """One organism profile's run exactly as documented (``bandit``: the README's main job), timed, with its
    evaluations before RL (the warm start), after RL and of the base model, beside the baselines."""
    out = work / short
    done = work / f"{short}.json"
    if done.is_file():
        return json.loads(done.read_text())
    job = profile_job(short)
    cmd = [_bin(job[0]), *job[1:], "--output_dir", str(out), "--overwrite_output_dir"]
    cmd += QUICK if quick else []
    timing = _timed(cmd, work / f"{short}.log")
    report = json.loads((out / "eval_report.json").read_text())
    first, last = report["evals"][0], report["evals"][-1]
    constants = report.get("constant_actions")
    if constants:
        action, best = max(constants.items(), key=lambda kv: kv[1]["rate"])
        best_constant: dict[str, Any] | None = {"action": action, **best}
        reason = None
    else:
        best_constant = None
        # an arm's position has no fixed meaning, so no constant answer exists to compare with
        reason = "Bandit has no constant answer: the arms' names and order change by seed"
    result = {
        "command": " ".join(job + (QUICK if quick else [])),
        "date": time.strftime("%Y-%m-%d"),
        "num_eval_seeds": first["success"]["n"],
        "eval_seeds": report["seeds"],
        "base": report["warm_start"]["base"]["success"],
        "warm_start": {k: first[k] for k in ("success", "valid")},
        "after": {k: last[k] for k in ("success", "valid", "success_given_valid")},
        "rl_steps": last["step"],
        "baselines": {
            "random": report["baseline"]["random"],
            "optimum": report["baseline"]["optimum"],
            "best_constant": best_constant,
            **({"best_constant_reason": reason} if reason else {}),
        },
        **timing,
    }
    above = [result["baselines"]["random"]["ci"][1], result["warm_start"]["success"]["ci"][1]]
    if best_constant:
        above.append(best_constant["ci"][1])
    result["learned"] = result["after"]["success"]["ci"][0] > max(above)
    done.write_text(json.dumps(result, indent=2) + "\n")
    return result


def part_bandit(work: Path, quick: bool) -> dict[str, Any]:
    return part_profile(work, quick, "bandit")


def _eval(model: Path, out: Path, num_seeds: int, env_kwargs: dict[str, Any], log: Path) -> dict[str, Any]:
    """``llmgym-eval`` on the held-out pairs with the run's env limits and evaluation settings (the chat settings
    come from the model folder's run file)."""
    cmd = [_bin("llmgym-eval"), "--model", str(model), "--env", HELD_OUT_ENV, "--num_seeds", str(num_seeds)]
    cmd += ["--env_kwargs", json.dumps(env_kwargs), "--max_new_tokens", "12", "--temperature", "0.5"]
    cmd += ["--output_dir", str(out), "--overwrite", "--no_progress"]
    _timed(cmd, log)
    summary = json.loads((out / "summary.json").read_text())["envs"][HELD_OUT_ENV]
    return summary


def part_held_out(work: Path, quick: bool) -> dict[str, Any]:
    done = work / "bandit_held_out.json"
    if done.is_file():
        return json.loads(done.read_text())
    run = work / "bandit"
    n = 16 if quick else 512
    kw = json.loads((run / "eval_report.json").read_text())["env_kwargs"]
    ws = _eval(run / "warm_start" / "final", work / "held_out_warm_start", n, kw, work / "held_out_ws.log")
    after = _eval(run / "final", work / "held_out_after", n, kw, work / "held_out_after.log")

    def success(s: dict[str, Any]) -> dict[str, Any]:
        return {
            "successes": s["successes"],
            "n": s["episodes"],
            "rate": s["success_rate"],
            "ci": s["success_ci"],
        }

    result = {
        "env": HELD_OUT_ENV,
        "num_eval_seeds": n,
        "warm_start": {"success": success(ws), "valid": ws["valid"]},
        "after": {"success": success(after), "valid": after["valid"]},
        "baselines": {"random": after["baseline"]["random"], "best_constant": None},
    }
    result["learned"] = result["after"]["success"]["ci"][0] > max(
        result["baselines"]["random"]["ci"][1], result["warm_start"]["success"]["ci"][1]
    )
    done.write_text(json.dumps(result, indent=2) + "\n")
    return result


#: The settings the defaults decision rests on: the grpo preset's entropy bonus and per-group reward scaling,
#: each alone and together, against the organism profile's (neither).
DEFAULTS_GRID = {
    "entropy_0_scale_none": ["--entropy_coef", "0", "--scale_rewards", "none"],
    "entropy_0.001_scale_none": ["--entropy_coef", "0.001", "--scale_rewards", "none"],
    "entropy_0_scale_group": ["--entropy_coef", "0", "--scale_rewards", "group"],
    "entropy_0.001_scale_group": ["--entropy_coef", "0.001", "--scale_rewards", "group"],
}


#: RL seeds of the defaults grid: the evaluation interval covers the evaluation's sampling only, so each setting
#: runs from several training seeds (42 is the main job's; its parts keep their seedless names)
DEFAULTS_SEEDS = (42, 1, 2)


def part_defaults(work: Path, quick: bool) -> dict[str, Any]:
    """RL from the main job's warm start with each :data:`DEFAULTS_GRID` setting and training seed (one part
    each)."""
    warm = work / "bandit" / "warm_start" / "final"
    out: dict[str, Any] = {}
    for (setting, flags), seed in itertools.product(
        DEFAULTS_GRID.items(), DEFAULTS_SEEDS[:1] if quick else DEFAULTS_SEEDS
    ):
        name = setting if seed == DEFAULTS_SEEDS[0] else f"{setting}_seed{seed}"
        done = work / f"defaults_{name}.json"
        if not done.is_file():
            run = work / f"defaults_{name}"
            cmd = [_bin(MAIN_JOB[0]), *MAIN_JOB[1:], "--model", str(warm), "--warm_start", "none", *flags]
            cmd += ["--seed", str(seed)]
            cmd += [
                "--output_dir",
                str(run),
                "--overwrite_output_dir",
                "--collapse_report",
                "",
                "--mi_every",
                "0",
            ]
            cmd += QUICK[2:] if quick else []
            timing = _timed(cmd, work / f"defaults_{name}.log")
            report = json.loads((run / "eval_report.json").read_text())
            first, last = report["evals"][0], report["evals"][-1]
            result = {
                "flags": " ".join(flags),
                "seed": seed,
                "warm_start": {k: first[k] for k in ("success", "valid")},
                "after": {k: last[k] for k in ("success", "valid")},
                **timing,
            }
            done.write_text(json.dumps(result, indent=2) + "\n")
        out[name] = {"seed": seed, **json.loads(done.read_text())}
    return out


#: 3x3 deterministic CoordFrozenLake, one move a turn, three turns, no reasoning block (the probes' task): the
#: learning study's FrozenLake setting, the one place it is declared.
FL_ENV = _FROZENLAKE.env
FL_KWARGS = _FROZENLAKE.env_kwargs_with_limits()
#: ``llmgym-sft`` runs compared, name -> (format-token loss weight, steps); ``w1`` (TRL's loss, 300 steps) is the
#: reference. The organism reads the board only after a plateau of ~250 steps (its training accuracy on the move
#: stays near the moves' marginal until then), so the same data is also trained twice as long.
FL_RUNS = {"w1": (1.0, 300), "w0.1": (0.1, 300), "w0.1_600": (0.1, 600), "w0.1_900": (0.1, 900)}
#: The plain-PyTorch control (benchmarks/plain_control.py): trained on every move of the same solver episodes.
FL_CONTROL_STEPS = 300


def fl_sft_args(data: Path, out: Path, weight: float, steps: int) -> list[str]:
    """``llmgym-sft``'s arguments for a FrozenLake SFT run of :data:`FL_RUNS` (the one place its recipe is written):
    organism-s, steps of 32 episodes at lr 1e-3 constant, seed 0, format tokens weighed ``weight``."""
    args = ["--model", "organism-s", "--data", str(data), "--output_dir", str(out), "--overwrite_output_dir"]
    args += ["--max_steps", str(steps), "--per_device_train_batch_size", "32", "--learning_rate", "1e-3"]
    args += ["--lr_scheduler_type", "constant", "--seed", "0", "--format_loss_weight", str(weight)]
    return [*args, "--logging_steps", "50"]


def part_frozenlake_sft(work: Path, quick: bool, published: dict[str, Any] | None = None) -> dict[str, Any]:
    """``llmgym-sft`` on solver episodes for each of :data:`FL_RUNS`, then greedy ``llmgym-eval`` (one part
    each). ``published``: runs already published with the same weight and steps are taken as they are
    (``--reuse-published``) instead of being trained again."""
    data = frozenlake_data(work, quick)
    n = 16 if quick else 512
    out: dict[str, Any] = {}
    for name, (weight, full_steps) in FL_RUNS.items():
        steps = 4 if quick else full_steps
        done = work / f"frozenlake_sft_{name}.json"
        old = (published or {}).get(name)
        if not done.is_file() and old and (old["format_loss_weight"], old["steps"]) == (weight, steps):
            done.write_text(json.dumps(old, indent=2) + "\n")
        if not done.is_file():
            run = work / f"frozenlake_sft_{name}"
            cmd = [_bin("llmgym-sft"), *fl_sft_args(data, run, weight, steps)]
            timing = _timed(cmd, work / f"frozenlake_sft_{name}.log")
            ev = work / f"frozenlake_eval_{name}"
            cmd = [
                _bin("llmgym-eval"),
                "--model",
                str(run / "final"),
                "--env",
                FL_ENV,
                "--num_eval_seeds",
                str(n),
            ]
            cmd += [
                "--eval_seed",
                str(FL_EVAL_SEED),
                "--env_kwargs",
                json.dumps(FL_KWARGS),
                "--temperature",
                "0",
            ]
            cmd += [
                "--max_new_tokens",
                "16",
                "--output_dir",
                str(ev),
                "--overwrite_output_dir",
                "--no_progress",
            ]
            _timed(cmd, work / f"frozenlake_eval_{name}.log")
            s = json.loads((ev / "summary.json").read_text())["envs"][FL_ENV]
            rows = sum(1 for _ in data.open())
            result = {
                "format_loss_weight": weight,
                "episodes": rows,
                "steps": steps,
                "success": {"n": s["episodes"], "rate": s["success_rate"], "ci": s["success_ci"]},
                "valid": s["valid"],
                "baselines": s["baseline"],
                "sft": timing,
            }
            done.write_text(json.dumps(result, indent=2) + "\n")
        out[name] = json.loads(done.read_text())
    return out


#: held-out seeds of the FrozenLake comparison (the probes' evaluation seeds; far from export's 1,000,000..)
FL_EVAL_SEED = 200_000


#: The solver episodes' env seeds: the first seed and how many are tried (``--quick``: 40).
FL_SOLVER_SEED, FL_SOLVER_EPISODES = 1_000_000, 300


def frozenlake_data(work: Path, quick: bool) -> Path:
    """The solver episodes both our SFT and the control train on: ``llmgym export --policy expert`` on seeds
    :data:`FL_SOLVER_SEED`.. (:data:`FL_SOLVER_EPISODES` tried; seeds the solver cannot finish within the turn
    limit are skipped)."""
    data = work / "frozenlake_solver.jsonl"
    if not data.is_file():
        cmd = [_bin("llmgym"), "export", "--env", FL_ENV, "--env_kwargs", json.dumps(FL_KWARGS), "--policy"]
        n = 40 if quick else FL_SOLVER_EPISODES
        cmd += ["expert", "--seed", str(FL_SOLVER_SEED), "--num_episodes", str(n), "-o", str(data)]
        _timed(cmd, work / "frozenlake_export.log")
    return data


def part_frozenlake_control(work: Path, quick: bool) -> dict[str, Any]:
    """The plain-PyTorch control on the same solver episodes and the same held-out seeds."""
    import plain_control

    done = work / "frozenlake_control.json"
    if not done.is_file():
        n, steps = (16, 4) if quick else (512, FL_CONTROL_STEPS)
        seeds = range(FL_EVAL_SEED, FL_EVAL_SEED + n)
        result = plain_control.run(frozenlake_data(work, quick), FL_ENV, FL_KWARGS, seeds, steps=steps)
        done.write_text(json.dumps(result, indent=2) + "\n")
    return json.loads(done.read_text())


#: The parts, in the order they run; ``--parts`` picks some and ``--publish`` then keeps the others' published
#: sections as they are.
PARTS = ("bandit", "bandit_held_out", "defaults", "frozenlake", "coordfrozenlake")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work-dir", type=Path, required=True, help="runs and finished parts (resumable)")
    ap.add_argument("--quick", action="store_true", help="a few steps and 16 seeds: checks the pipeline only")
    ap.add_argument("--publish", action="store_true", help="write docs/data/organism_learning.json")
    ap.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated subset of {', '.join(PARTS)}; with --publish the other sections stay as published",
    )
    ap.add_argument(
        "--reuse-published",
        action="store_true",
        help="take FrozenLake SFT runs already published with the same settings instead of training them again",
    )
    args = ap.parse_args(argv)
    if args.quick and args.publish:
        ap.error("--quick results are never published")
    parts = [p for p in args.parts.split(",") if p]
    if unknown := sorted(set(parts) - set(PARTS)):
        ap.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    work, quick = args.work_dir, args.quick
    keep = set(parts) != set(PARTS) or args.reuse_published
    result: dict[str, Any] = json.loads(PUBLISHED.read_text()) if keep and not quick else {}
    # the file's date and machine are the whole run's; a part run alone dates its own section
    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}",
        "cpus": os.cpu_count(),
    }
    if not result:
        result.update(stamp)
    result["quick"] = quick
    envs = result.setdefault("envs", {})
    if "bandit" in parts:
        envs["llmgym/Bandit-v0"] = {"grpo": part_bandit(work, quick)}
    if "bandit_held_out" in parts:
        envs[HELD_OUT_ENV] = {"grpo": part_held_out(work, quick)}
    if "coordfrozenlake" in parts:
        envs[FL_ENV] = {"grpo": part_profile(work, quick, "coordfrozenlake")}
    if "defaults" in parts:
        runs = part_defaults(work, quick)
        result["defaults"] = {"env": "llmgym/Bandit-v0", "from": "the main job's warm start", "runs": runs}
    if "frozenlake" in parts:
        reuse = result.get("frozenlake_sft", {}).get("runs") if args.reuse_published else None
        result["frozenlake_sft"] = {
            "env": FL_ENV,
            "env_kwargs": FL_KWARGS,
            "model": "organism-s",
            "runs": part_frozenlake_sft(work, quick, reuse),
            "control": part_frozenlake_control(work, quick),
            **({"date": stamp["date"]} if keep else {}),
        }
    text = json.dumps(result, indent=2) + "\n"
    (args.work_dir / "organism_learning.json").write_text(text)
    # a --quick run of some parts has only those sections
    bandit = envs.get("llmgym/Bandit-v0", {}).get("grpo")
    defaults = result.get("defaults", {}).get("runs", {})
    frozenlake = result.get("frozenlake_sft", {}).get("runs", {})
    control = result.get("frozenlake_sft", {}).get("control")
    for env, runs in envs.items():
        r = runs["grpo"]
        ws, after, rnd = r["warm_start"]["success"], r["after"]["success"], r["baselines"]["random"]
        print(
            f"{env}: warm start {format_rate(ws)} -> after {format_rate(after)}; "
            f"random {format_rate(rnd)}; after / random {after['rate'] / max(rnd['rate'], 1e-9):.2f}x; "
            f"{'learned' if r['learned'] else 'NOT above random and warm start'} (n={after['n']})"
        )
    if bandit:
        print(f"main job: {bandit['wall_seconds']:.0f} s wall, {bandit['cpu_seconds']:.0f} CPU-s")
    for name, r in defaults.items():
        after, valid = r["after"]["success"], r["after"]["valid"]
        print(f"defaults {name}: after {format_rate(after)}, valid {format_rate(valid, 2)}")
    ref = frozenlake["w1"]["success"]["rate"] if "w1" in frozenlake else float("nan")
    for name, r in frozenlake.items():
        sr, rnd = r["success"], r["baselines"]["random"]
        print(
            f"FrozenLake SFT {name}: {format_rate(sr)}, random {format_rate(rnd)}; "
            f"vs w1: {sr['rate'] / max(ref, 1e-9):.2f}x"
            + (f", vs control: {sr['rate'] / max(control['success']['rate'], 1e-9):.2f}x" if control else "")
            + f"; SFT {r['sft']['cpu_seconds']:.0f} CPU-s"
        )
    if control:
        c = control["success"]
        print(
            f"FrozenLake control (plain PyTorch, {control['states']} states): {format_rate(c)}; "
            f"{control['train_cpu_seconds']:.0f} CPU-s"
        )
    if args.publish:
        PUBLISHED.write_text(text)
        print(f"wrote {PUBLISHED}")
        for short in PROFILE_ENVS:  # the learning curve of each profile run this invocation recorded
            curve = work / short / "learning_curve.png"
            if short in parts and curve.is_file():
                shutil.copyfile(curve, IMG / f"organism_{short}_learning_curve.png")
                print(f"wrote {IMG / f'organism_{short}_learning_curve.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
