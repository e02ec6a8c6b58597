"""Did a refactor change what ``llmgym-train`` does? Record tiny runs once, rerun them after each change, compare.

    python -m scripts.same_behaviour record REF_DIR          # before the change
    python -m scripts.same_behaviour check REF_DIR           # after it: reruns into a temporary folder, compares

Run from the repository root (it builds the tiny random model of ``tests/_tiny.py``). Each run is a separate
process calling ``llmgym-train``'s ``main`` with fixed seeds; what is kept per run:

- ``episodes.jsonl`` byte for byte, and ``eval_report.json``;
- every dict ``Trainer.log`` received (the logged metrics), timing keys left out;
- ``collapse.jsonl`` (the MI / SNR series), timing keys left out;
- a SHA-256 of each ``*.safetensors`` file of the final model (weights, value head, critic);
- the ``llmgym-train:`` summary lines (the run time blanked).

Also compared: ``--dry_run`` output for a few command lines, ``--help`` of every command (exit code 0; the text
too, except ``llmgym-train``'s, whose layout is allowed to change: its option strings and defaults must not).

The tiny model cannot play, so every reward would be the same format penalty and the SNR filter would drop every
group. Two test-only env ids therefore add ``0.25 * (len(response) % 3)`` to Bandit's and FrozenLake's reward,
giving the groups reward variance (the filter keeps some and drops others, and the update runs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "SDL_VIDEODRIVER": "dummy",
    "SDL_AUDIODRIVER": "dummy",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
}

COMMON = ["--max_steps", "3", "--num_eval_seeds", "4", "--report_to", "none", "--seed", "1"]
#: name -> llmgym-train arguments (the model and output folder are added).
RUNS: dict[str, list[str]] = {
    # GRPO, SNR top_p filter (remove, fixed steps), MI every round (cached scorer)
    "bandit_grpo": ["--env", "rtref/NoisyBandit-v0", "--mi_every", "1", *COMMON],
    # our loss (aggregation + dual clip), proportional update steps, sqrt loss scaling, MI through TRL's scorer
    "frozenlake_grpo": [
        "--env",
        "rtref/NoisyFrozenLake-v0",
        "--max_turns",
        "2",
        "--mi_every",
        "2",
        "--mi_scorer",
        "trl",
        "--filter_update_steps",
        "proportional",
        "--filter_loss_scaling",
        "sqrt",
        "--loss_agg_mode",
        "seq-mean-token-mean",
        "--dual_clip",
        "3.0",
        *COMMON,
    ],
    # PPO (value head), advantages after the filter, masked drop
    "frozenlake_ppo": [
        "--env",
        "rtref/NoisyFrozenLake-v0",
        "--algo",
        "ppo",
        "--max_turns",
        "2",
        "--mi_every",
        "1",
        "--advantages_after_filter",
        "True",
        "--filter_drop",
        "mask",
        "--filter_loss_scaling",
        "linear",
        *COMMON,
    ],
    # PPO with a separate critic
    "bandit_ppo_critic": [
        "--env",
        "rtref/NoisyBandit-v0",
        "--algo",
        "ppo",
        "--critic_model",
        "separate",
        *COMMON,
    ],
    # the real Bandit (every group has zero variance): the filter skips every update
    "bandit_real_skip": ["--env", "Bandit", "--mi_every", "1", *COMMON],
    # the real Bandit with the filter off
    "bandit_real_nofilter": ["--env", "Bandit", "--filter_strategy", "off", "--mi_every", "0", *COMMON],
}

DRY_RUNS: dict[str, list[str]] = {
    "frozenlake": ["--env", "FrozenLake"],
    "sokoban_ragen2": ["--env", "Sokoban", "--profile", "ragen2"],
    "bandit_ppo": ["--env", "Bandit", "--algo", "ppo", "--set", "filter_value=0.5"],
    "countdown_flags": ["--env", "Countdown", "--num_prompts", "4", "--learning_rate", "3e-6", "-o", "x/y"],
    "frozenlake_gpu_mem": ["--env", "FrozenLake", "--gpu_memory_gib", "24"],
}

#: ``module:function`` -> help command lines (each must exit 0).
HELP = {
    "llmgym": (
        "llm_gym.cli",
        [[], ["view"], ["render"], ["play"], ["export"], ["check-template"]],
    ),
    "llmgym-train": ("llm_gym.trainer.cli", [[]]),
    "llmgym-eval": ("llm_gym.trainer.evaluate", [[]]),
    "llmgym-collapse-report": ("llm_gym.trainer.collapse_report", [[]]),
}

_TIMING = re.compile(r"seconds|_time|runtime|per_second")


def _untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not _TIMING.search(k)}


# ------------------------------------------------------------------------------------------ child process
def _register_noisy_envs() -> None:
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    import llm_gym  # noqa: F401  (registers llmgym/*)

    for name in ("Bandit", "FrozenLake"):
        spec = gym.spec(f"llmgym/{name}-v0")
        base = load_env_creator(spec.entry_point)

        class Noisy(base):  # type: ignore[misc, valid-type]
            def step(self, action):
                obs, reward, terminated, truncated, info = super().step(action)
                return obs, reward + 0.25 * (len(action) % 3), terminated, truncated, info

        Noisy.__name__ = Noisy.__qualname__ = f"Noisy{base.__name__}"
        gym.register(f"rtref/Noisy{name}-v0", entry_point=Noisy, kwargs=dict(spec.kwargs))


def _child_run(name: str, model: str, work: str, out: str) -> int:
    import transformers

    _register_noisy_envs()
    logs: list[dict] = []
    original = transformers.Trainer.log

    def log(self, logs_in, *args, **kwargs):
        logs.append(_untimed(dict(logs_in)))
        return original(self, logs_in, *args, **kwargs)

    transformers.Trainer.log = log
    from llm_gym.trainer.cli import main

    code = main([*RUNS[name], "--model", model, "-o", work, "--overwrite_output_dir"])
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    (target / "exit_code.txt").write_text(f"{code}\n")
    (target / "metrics.json").write_text(json.dumps(logs, indent=1, sort_keys=True) + "\n")
    for file in ("episodes.jsonl", "eval_report.json"):
        if (Path(work) / file).is_file():
            shutil.copy(Path(work) / file, target / file)
    collapse = Path(work) / "collapse.jsonl"
    if collapse.is_file():
        rows = [_untimed(json.loads(line)) for line in collapse.read_text().splitlines() if line.strip()]
        (target / "collapse.json").write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    hashes = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((Path(work) / "final").glob("*.safetensors"))
    }
    (target / "weights.json").write_text(json.dumps(hashes, indent=1) + "\n")
    return 0


def _child_parser_facts(out: str) -> int:
    """llmgym-train's option strings (hidden aliases included) and every destination's default."""
    from llm_gym.trainer.cli import build_parser

    parser = build_parser()
    facts = {
        "options": sorted(parser._option_string_actions),
        "defaults": {a.dest: repr(a.default) for a in parser._actions if a.dest != "help"},
    }
    Path(out).write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    return 0


# ------------------------------------------------------------------------------------------ parent
def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, **ENV}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, **kwargs)


def _summary(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("llmgym-train:")]
    return "\n".join(re.sub(r"done in \d+s", "done in Ns", ln) for ln in lines) + "\n"


def record(out_dir: Path, model: str | None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.gettempdir()) / "same_behaviour_work"  # fixed: paths inside records stay the same
    if model is None:
        model = str(work / "tiny")
        if not (Path(model) / "config.json").is_file():
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests._tiny import build_tiny_model

            build_tiny_model(model)
    me = [sys.executable, "-m", "scripts.same_behaviour"]
    for name in RUNS:
        target = out_dir / "runs" / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(work / "run", ignore_errors=True)
        res = _run([*me, "_run", name, model, str(work / "run"), str(target)])
        if res.returncode:
            sys.exit(f"run {name} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        (target / "summary.txt").write_text(_summary(res.stdout))
        print(f"recorded run {name}")
    dry = out_dir / "dry_run"
    dry.mkdir(exist_ok=True)
    for name, argv in DRY_RUNS.items():
        code = "import sys; from llm_gym.trainer.cli import main; sys.exit(main(sys.argv[1:]))"
        res = _run([sys.executable, "-c", code, *argv, "--model", model, "--dry_run"])
        (dry / f"{name}.txt").write_text(f"exit {res.returncode}\n{res.stdout}")
    helps = out_dir / "help"
    helps.mkdir(exist_ok=True)
    for cmd, (module, variants) in HELP.items():
        for sub in variants:
            code = f"import sys; from {module} import main; sys.exit(main(sys.argv[1:]))"
            res = _run([sys.executable, "-c", code, *sub, "--help"])
            name = "_".join([cmd, *sub])
            (helps / f"{name}.txt").write_text(f"exit {res.returncode}\n{res.stdout}")
    res = _run([*me, "_parser", str(out_dir / "train_parser.json")])
    if res.returncode:
        sys.exit(f"parser facts failed:\n{res.stderr[-3000:]}")
    print(f"recorded into {out_dir}")


def compare(ref: Path, new: Path) -> list[str]:
    problems = []
    for path in sorted(p for p in ref.rglob("*") if p.is_file()):
        rel = path.relative_to(ref)
        other = new / rel
        if not other.is_file():
            problems.append(f"missing: {rel}")
            continue
        a, b = path.read_text(), other.read_text()
        if rel.parts[0] == "help":
            if not b.startswith("exit 0\n"):
                problems.append(f"{rel}: --help did not exit 0")
            if rel.name == "llmgym-train.txt":
                continue  # layout may change; train_parser.json holds its options and defaults
        if a != b:
            problems.append(f"differs: {rel}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("record", help="record the runs into a folder")
    p.add_argument("out")
    p.add_argument("--model", default=None, help="tiny model folder (default: built once)")
    p = sub.add_parser("check", help="record into a temporary folder and compare with REF")
    p.add_argument("ref")
    p.add_argument("--model", default=None)
    p.add_argument("--keep", default=None, help="record into this folder instead of a temporary one")
    p = sub.add_parser("_run")
    p.add_argument("name")
    p.add_argument("model")
    p.add_argument("work")
    p.add_argument("out")
    p = sub.add_parser("_parser")
    p.add_argument("out")
    args = parser.parse_args(argv)
    if args.cmd == "_run":
        return _child_run(args.name, args.model, args.work, args.out)
    if args.cmd == "_parser":
        return _child_parser_facts(args.out)
    if args.cmd == "record":
        record(Path(args.out), args.model)
        return 0
    new = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="same_behaviour_"))
    record(new, args.model)
    problems = compare(Path(args.ref), new)
    for line in problems:
        print(line)
    print("same behaviour" if not problems else f"{len(problems)} difference(s); new records in {new}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
