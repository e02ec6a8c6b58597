"""Does GRPO training learn the task, or only the answer format? A small CPU study against chance.

For each environment setting and each condition (no filter vs the SNR filter, top-p 0.9, at the same
generation budget: P seeds x G rollouts per step, every step) and each training seed, it runs ``llmgym-train``
(in process, through its ``main``) and reads the run's episode records:

* the training curve: success and valid-answer rate of every generation round (P x G episodes) vs step;
* evaluation of the untrained model and of each trained model on held-out seeds (disjoint from the training
  seeds ``train_seed..`` and from the pilot seeds), with Wilson 95% intervals; success among fully valid
  episodes is reported apart from the valid-answer rate;
* the reference in the same run, on the same held-out seeds and limits (``llm_gym.agent.baselines``): the random
  valid-action policy, every constant answer ("always Right": the template a collapsed model plays) and the
  solver optimum.

Writes ``learning_study.json`` (results), ``learning_study.png`` (curves with the baseline band) and a markdown
table (``learning_study.md``) into ``--out-dir`` (default ``learning_study_out/``; ``--publish`` writes the
published copies in ``docs/``), and prints for each run the after/baseline success ratio.

    OMP_NUM_THREADS=1 python benchmarks/learning_study.py --quick             # tiny random model, seconds
    # what docs/learning-study.md reports: learning-rate pilots, then the study in two parallel lanes, merged
    bash benchmarks/learning_study_protocol.sh /tmp/learning_study
    # one piece of it by hand: FrozenLake, training seed 0, both conditions, 128 held-out seeds
    OMP_NUM_THREADS=1 python benchmarks/learning_study.py --envs FrozenLake --train-seeds 0 --max-steps 6 \
        --num-prompts 4 --num-generations 4 --micro-batch 4 --bf16 --learning-rate 1e-5 --out-dir /tmp/f

``--work-dir`` keeps the runs (records, final models); by default they go to a temporary folder.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline, single-threaded; before torch)

from llm_gym.agent.baselines import (  # noqa: E402
    NoBaseline,
    baseline_success,
    constant_action_success,
    episode_outcomes,
    format_outcomes,
    format_rate,
    outcome_summary,
)
from llm_gym.agent.records import read_records  # noqa: E402

#: First held-out evaluation seed: far from the training seeds (train_seed 10000 + k * 1000 + s * P + g),
#: from RAGEN's validation seeds (123..) and from the pilot seeds (5000..) used to choose the setting.
HELD_OUT_SEED = 200_000


@dataclass(frozen=True)
class EnvSetting:
    """One environment setting of the study: the env id, its kwargs and the turn/action limits."""

    name: str
    env: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 1
    max_actions_per_turn: int = 1
    max_actions: int = 1
    #: Tokens per reply: the answer-only format needs few (``<answer>Left</answer>`` is 6 tokens).
    max_new_tokens: int = 16

    def env_kwargs_with_limits(self) -> dict[str, Any]:
        """gym.make kwargs of the training runs: the limits, answer-only format, then ``env_kwargs``."""
        return {
            "max_turns": self.max_turns,
            "max_actions_per_turn": self.max_actions_per_turn,
            "max_actions": self.max_actions,
            "think": False,
            **self.env_kwargs,
        }

    def train_args(self) -> list[str]:
        return [
            "--env",
            self.env,
            "--env_kwargs",
            json.dumps(self.env_kwargs),
            "--max_turns",
            str(self.max_turns),
            "--max_actions_per_turn",
            str(self.max_actions_per_turn),
            "--max_actions",
            str(self.max_actions),
            "--max_new_tokens",
            str(self.max_new_tokens),
        ]


#: The settings chosen by the pilots (see docs/learning-study.md): deterministic 3x3 FrozenLake with the
#: coordinate observation, one action per turn, 3 turns; and RAGEN's two-armed bandit (one answer).
SETTINGS: dict[str, EnvSetting] = {
    "FrozenLake": EnvSetting(
        "FrozenLake",
        "llmgym/CoordFrozenLake-v0",
        {"success_rate": 1.0, "size": 3},
        max_turns=3,
        max_actions_per_turn=1,
        max_actions=3,
        max_new_tokens=12,
    ),
    "Bandit": EnvSetting("Bandit", "llmgym/Bandit-v0"),
}

#: Conditions at equal generation budget: the filter only decides which groups enter the update.
CONDITIONS: dict[str, list[str]] = {
    "no_filter": ["--filter_strategy", "off"],
    "snr_top_p_0.9": ["--filter_strategy", "top_p", "--filter_value", "0.9"],
}


# ------------------------------------------------------------------------------------------------ analysis
def split_records(records: Sequence[Any]) -> list[dict[str, Any]]:
    """Success and valid-answer rate of each training round (``meta["mode"] == "train"``), by step."""
    train: dict[int, list[Any]] = {}
    for r in records:
        if r.meta.get("mode") == "train":
            train.setdefault(int(r.meta.get("step", -1)), []).append(r)
    curve = []
    for step in sorted(train):
        o = episode_outcomes(train[step])
        curve.append(
            {
                "step": step,
                "episodes": o["episodes"],
                "success": o["successes"] / o["episodes"],
                "valid": o["valid_episodes"] / o["episodes"],
            }
        )
    return curve


def held_out_eval(
    model: str,
    setting: EnvSetting,
    seeds: Sequence[int],
    *,
    temperature: float = 0.5,
    batch_size: int = 32,
    dtype: str = "float32",
) -> dict[str, Any]:
    """Play ``seeds`` once each with ``model`` (sampling at ``temperature``, RAGEN's validation setting) in the
    chat format of llmgym-train's CPU runs (answer-only, one demonstration turn) and summarise.

    Through :class:`HFPolicy`, outside the trainer: one code path and one sampling stream for the untrained and
    every trained model. ``dtype="bfloat16"`` halves the cost on a CPU with bf16 instructions (AVX512-BF16, AMX)."""
    import torch
    from llm_gym.trainer.policies import HFPolicy, SamplingParams

    from llm_gym.agent.chat import ChatFormat
    from llm_gym.agent.rollout import rollout

    torch.manual_seed(0)  # the same sampling stream for every model evaluated
    policy = HFPolicy.from_pretrained(
        model,
        SamplingParams(temperature, 1.0, setting.max_new_tokens),
        batch_size=batch_size,
        device="cpu",
        dtype=dtype,
    )
    records = rollout(
        setting.env,
        list(seeds),
        policy,
        env_kwargs=setting.env_kwargs_with_limits(),
        chat=ChatFormat(one_shot=True),
    )
    return outcome_summary(records)


def run_once(
    setting: EnvSetting,
    condition: str,
    seed: int,
    *,
    model: str,
    out_dir: Path,
    common: Sequence[str],
    max_steps: int,
    eval_seeds: Sequence[int],
    eval_dtype: str = "float32",
) -> dict[str, Any]:
    """One ``llmgym-train`` run (no in-training evaluation), then :func:`held_out_eval` of its final model;
    returns the training curve and the evaluation (raises on a failed run)."""
    from llm_gym.trainer.cli import main as train_main

    run_dir = out_dir / f"{setting.name}-{condition}-seed{seed}"
    argv = [
        *setting.train_args(),
        *CONDITIONS[condition],
        "--model",
        model,
        *common,
        "--max_steps",
        str(max_steps),
        "--seed",
        str(seed),
        "--train_seed",
        str(10_000 + 1_000 * seed),
        "--num_eval_seeds",
        "0",
        "--output_dir",
        str(run_dir),
    ]
    t0 = time.perf_counter()
    rc = train_main(argv)
    train_wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"llmgym-train exited with {rc}: {shlex.join(argv)}")
    curve = split_records(read_records(run_dir / "episodes.jsonl"))
    t1 = time.perf_counter()
    after = held_out_eval(str(run_dir / "final"), setting, eval_seeds, dtype=eval_dtype)
    return {
        "condition": condition,
        "seed": seed,
        "argv": shlex.join(argv),
        "train_wall_seconds": round(train_wall, 1),
        "eval_wall_seconds": round(time.perf_counter() - t1, 1),
        "curve": curve,
        "after": after,
    }


# ------------------------------------------------------------------------------------------------ outputs
def _fmt(s: dict[str, Any]) -> str:
    return format_rate(s, 2) if s["n"] else "- (n=0)"


def constant_actions(setting: dict[str, Any], eval_seeds: Sequence[int]) -> dict[str, Any] | None:
    """Success of every "always answer action a" policy on the held-out seeds (None for Bandit)."""
    try:
        return constant_action_success(
            setting["env"],
            eval_seeds,
            {**setting["env_kwargs"], "think": False},
            setting["max_turns"],
            max_actions_per_turn=setting["max_actions_per_turn"],
            max_actions=setting["max_actions"],
        )
    except NoBaseline:
        return None


def best_constant(env: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The constant-answer policy with the highest held-out success, as ``(action, rate)``."""
    const = env.get("constant_actions")
    return max(const.items(), key=lambda kv: kv[1]["rate"]) if const else None


def markdown_table(results: dict[str, Any]) -> str:
    """One table per environment: the untrained model, then success, valid answers and success among valid
    answers after training, per run, against the random valid-action baseline on the same held-out seeds."""
    out = []
    for env_name, env in results["envs"].items():
        b, st = env["baseline"], env["setting"]
        ref = f"random valid-action policy {_fmt(b['random'])}" if b["random"] else "no random baseline"
        if b["optimum"]:
            ref += f"; solver optimum {_fmt(b['optimum'])}"
        best = best_constant(env)
        if best:
            ref += (
                f"; best constant answer (always `{best[0]}`, an input-independent template) {_fmt(best[1])}"
            )
        out += [
            f"### {env_name}",
            "",
            f"`{st['env']}` with `{json.dumps(st['env_kwargs'])}`, {st['max_turns']} turn(s) x "
            f"{st['max_actions_per_turn']} action, {st['max_new_tokens']} tokens per reply. Evaluation seeds "
            f"{env['eval_seeds'][0]}..{env['eval_seeds'][1]} ({env['num_eval_seeds']}). Reference on the same seeds "
            f"and limits: {ref}. Intervals: Wilson 95%.",
            "",
            "| model | success | valid answers | success among valid | success / random |",
            "|---|---|---|---|---|",
        ]
        rows = [("untrained", env.get("untrained"))] + [
            (
                f"{r['condition']}, seed {r['seed']}, after {env['settings']['max_steps']} steps",
                r["after"],
            )
            for r in env["runs"]
        ]
        for label, ev in rows:
            if ev is None:
                continue
            rate = ev["success"]["rate"]
            ratio = f"{rate / b['random']['rate']:.2f}" if b["random"] and b["random"]["rate"] else "-"
            out.append(
                f"| {label} | {_fmt(ev['success'])} | {_fmt(ev['valid'])} | {_fmt(ev['success_given_valid'])} "
                f"| {ratio} |"
            )
        out.append("")
    return "\n".join(out)


def plot(results: dict[str, Any], path: Path) -> None:
    """Success and valid-answer rate of the training rounds vs step, one line per run; the random baseline's
    interval as a band; held-out evaluations (untrained at step 0, each run at the end) as dots with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(results["envs"])
    fig, axes = plt.subplots(2, len(envs), figsize=(5.5 * len(envs), 6.5), squeeze=False)
    colors = {"no_filter": "tab:blue", "snr_top_p_0.9": "tab:orange"}

    def dot(ax: Any, x: float, s: dict[str, Any], color: str, label: str | None = None) -> None:
        err = [[s["rate"] - s["ci"][0]], [s["ci"][1] - s["rate"]]]
        ax.errorbar([x], [s["rate"]], yerr=err, fmt="o", ms=4, color=color, capsize=2, label=label)

    for j, env_name in enumerate(envs):
        env = results["envs"][env_name]
        steps, first_seed = env["settings"]["max_steps"], env["settings"]["train_seeds"][0]
        for i, key in enumerate(("success", "valid")):
            ax = axes[i][j]
            if key == "success" and env["baseline"]["random"]:
                lo, hi = env["baseline"]["random"]["ci"]
                ax.axhspan(lo, hi, color="grey", alpha=0.25, label="random valid actions (95% CI)")
                best = best_constant(env)
                if best:
                    ax.axhline(
                        best[1]["rate"], color="grey", ls=":", lw=1.2, label=f"always {best[0]} (template)"
                    )
            if env.get("untrained"):
                dot(ax, -0.3, env["untrained"][key], "black", "untrained model (held-out)")
            for k, r in enumerate(env["runs"]):
                c = colors.get(r["condition"], "tab:green")
                ax.plot(
                    [p["step"] for p in r["curve"]],
                    [p[key] for p in r["curve"]],
                    "-" if r["seed"] == first_seed else "--",
                    color=c,
                    lw=1,
                    alpha=0.8,
                    label=f"{r['condition']} seed {r['seed']}",
                )
                dot(ax, steps + 0.15 * (k + 1), r["after"][key], c)
            ax.set_ylim(-0.02, 1.02)
            what = "success" if key == "success" else "valid-answer rate"
            ax.set_title(f"{env_name}: {what}", fontsize=10)
            ax.set_xlabel("step (lines: training rounds; dots: held-out eval, 95% CI)", fontsize=8)
            ax.grid(alpha=0.3)
        axes[0][j].legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny random model, 1 step, 4 eval seeds (seconds)")
    p.add_argument(
        "--model", default="smollm2", help="model for llmgym-train (default: offline SmolLM2-135M)"
    )
    p.add_argument("--envs", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    p.add_argument("--train-seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--num-prompts", type=int, default=2, help="P: seeds per step")
    p.add_argument("--num-generations", type=int, default=8, help="G: rollouts per seed")
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="rollouts per forward/backward pass (default: the whole round, P x G); the round is accumulated",
    )
    p.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 autocast in training and bf16 evaluation (on an AVX512-BF16 CPU: forward passes 2x faster, "
        "a whole training step about 11%% faster)",
    )
    p.add_argument(
        "--skip-untrained",
        action="store_true",
        help="do not evaluate the untrained model (another invocation on the same seeds does; see --merge)",
    )
    p.add_argument("--num-eval-seeds", type=int, default=128)
    p.add_argument("--eval-seed", type=int, default=HELD_OUT_SEED, help="first held-out evaluation seed")
    p.add_argument("--work-dir", default=None, help="where the runs go (default: a temporary folder)")
    p.add_argument(
        "--out-dir",
        default=None,
        help="results JSON goes here (default: learning_study_out/, or docs/ with --publish)",
    )
    p.add_argument("--png", default=None, help="the plot (default: OUT_DIR/learning_study.png)")
    p.add_argument("--md", default=None, help="markdown table file (default: OUT_DIR/learning_study.md)")
    p.add_argument(
        "--publish",
        action="store_true",
        help="write the published results: docs/data/learning_study.{json,md} and docs/img/learning_study.png "
        "(never with --quick)",
    )
    p.add_argument(
        "--env-eval-seeds",
        nargs="*",
        default=[],
        metavar="ENV=N",
        help="held-out seeds for one environment instead of --num-eval-seeds (e.g. FrozenLake=32)",
    )
    p.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute activations in the update (slower; needed for multi-turn batches on a small-memory box)",
    )
    p.add_argument(
        "--merge", nargs="+", metavar="JSON", help="only merge earlier results files into one JSON/PNG/table"
    )
    p.add_argument(
        "--pick-lr",
        nargs="+",
        metavar="JSON",
        help="only print the learning rate that the pilots (one results file per rate) choose; see pick_lr",
    )
    a = p.parse_args(argv)
    if a.publish:  # only an explicit flag writes into docs/ (a quick or exploratory run never does)
        if a.quick or a.out_dir or a.png or a.md:
            raise SystemExit("--publish writes docs/ itself: not with --quick, --out-dir, --png or --md")
        a.out_dir, a.png = "docs/data", "docs/img/learning_study.png"
    a.out_dir = a.out_dir or "learning_study_out"
    a.png = a.png or str(Path(a.out_dir) / "learning_study.png")
    a.md = a.md or str(Path(a.out_dir) / "learning_study.md")
    try:
        a.env_eval_seeds = {k: int(v) for k, v in (item.split("=", 1) for item in a.env_eval_seeds)}
    except ValueError:
        raise SystemExit(f"--env-eval-seeds expects ENV=N items, got {a.env_eval_seeds}") from None
    if a.quick:
        a.max_steps, a.num_eval_seeds, a.train_seeds, a.env_eval_seeds = 1, 4, a.train_seeds[:1], {}
        a.num_prompts, a.num_generations = 2, 2
    if a.max_steps < 1 or a.num_eval_seeds < 1 or a.num_prompts < 1 or a.num_generations < 2:
        raise SystemExit(
            "need --max-steps >= 1, --num-eval-seeds >= 1, --num-prompts >= 1, --num-generations >= 2"
        )
    rollouts = a.num_prompts * a.num_generations
    a.micro_batch = rollouts if a.micro_batch is None else a.micro_batch
    if a.micro_batch < 1 or rollouts % a.micro_batch:
        raise SystemExit(f"--micro-batch must divide P x G = {rollouts}")
    return a


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    if a.pick_lr:
        lr, table = pick_lr(a.pick_lr)
        for row in table:
            print(
                f"[learning_study] pilot lr {row[0]:g}: pilot-seed success {row[1]:.3f}, training success {row[2]:.3f}"
            )
        print(f"{lr:g}")
        return {"learning_rate": lr, "pilots": table}
    if a.merge:
        results = merge(a.merge)
        write_outputs(results, a)
        print(
            f"[learning_study] merged {len(a.merge)} files into {a.out_dir}/learning_study.json, {a.png}, {a.md}"
        )
        return results
    t0 = time.perf_counter()
    tmp = tempfile.TemporaryDirectory(prefix="learning_study_")
    work = Path(a.work_dir or tmp.name)
    model = a.model
    if a.quick:
        from tests._tiny import build_tiny_model

        model = build_tiny_model(work / "tiny-model")
    common = [
        "--num_prompts", str(a.num_prompts), "--num_generations", str(a.num_generations),
        "--learning_rate", str(a.learning_rate), "--mi_every", "0", "--save_strategy", "no",
        "--report_to", "none", "--disable_tqdm", "True", "--gradient_checkpointing", str(a.gradient_checkpointing),
        "--per_device_train_batch_size", str(a.micro_batch),
        "--gradient_accumulation_steps", str(a.num_prompts * a.num_generations // a.micro_batch),
        "--bf16", str(a.bf16),
    ]  # fmt: skip
    eval_dtype = "bfloat16" if a.bf16 else "float32"
    results: dict[str, Any] = {
        "command": "python benchmarks/learning_study.py "
        + shlex.join(list(argv if argv is not None else sys.argv[1:])),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "settings": {
            "model": "tiny random (quick)" if a.quick else a.model,
            "max_steps": a.max_steps,
            "num_prompts": a.num_prompts,
            "num_generations": a.num_generations,
            "learning_rate": a.learning_rate,
            "bf16": a.bf16,
            "num_eval_seeds": a.num_eval_seeds,
            "first_eval_seed": a.eval_seed,
            "train_seeds": a.train_seeds,
            "conditions": {c: CONDITIONS[c] for c in a.conditions},
            "common_args": common,
        },
        "envs": {},
    }
    for env_name in a.envs:
        s = SETTINGS[env_name]
        n_eval = a.env_eval_seeds.get(env_name, a.num_eval_seeds)
        eval_seeds = list(range(a.eval_seed, a.eval_seed + n_eval))
        base = baseline_success(
            s.env,
            eval_seeds,
            {**s.env_kwargs, "think": False},  # CPU runs answer without <think>: the baseline does the same
            s.max_turns,
            max_actions_per_turn=s.max_actions_per_turn,
            max_actions=s.max_actions,
        )
        env_res: dict[str, Any] = {
            "setting": asdict(s),
            "settings": results["settings"],
            "num_eval_seeds": n_eval,
            "eval_seeds": [eval_seeds[0], eval_seeds[-1]],
            "baseline": base,
            "constant_actions": constant_actions(asdict(s), eval_seeds),
            "runs": [],
        }
        results["envs"][env_name] = env_res
        rb = base["random"]["rate"] if base["random"] else math.nan
        if not a.skip_untrained:
            t1 = time.perf_counter()
            env_res["untrained"] = held_out_eval(model, s, eval_seeds, dtype=eval_dtype)
            env_res["untrained_eval_wall_seconds"] = round(time.perf_counter() - t1, 1)
            print(
                f"[learning_study] {env_name} untrained: {format_outcomes(env_res['untrained'])} "
                f"(random valid {rb:.3f}), {env_res['untrained_eval_wall_seconds']:.0f}s",
                flush=True,
            )
        # seeds outermost, so that a study cut short still has both conditions at equal numbers of seeds
        for seed in a.train_seeds:
            for cond in a.conditions:
                r = run_once(s, cond, seed, model=model, out_dir=work, common=common, max_steps=a.max_steps,
                             eval_seeds=eval_seeds, eval_dtype=eval_dtype)  # fmt: skip
                env_res["runs"].append(r)
                after = r["after"]["success"]["rate"]
                print(
                    f"[learning_study] {env_name} {cond} seed {seed}: {format_outcomes(r['after'])}; after/random "
                    f"{after / rb if rb else math.nan:.2f}; train {r['train_wall_seconds']:.0f}s, "
                    f"eval {r['eval_wall_seconds']:.0f}s",
                    flush=True,
                )
                results["wall_seconds"] = round(time.perf_counter() - t0, 1)
                write_outputs(results, a)  # after every run: a study cut short keeps what it ran
    results["wall_seconds"] = round(time.perf_counter() - t0, 1)
    write_outputs(results, a)
    print(
        f"[learning_study] wrote {a.out_dir}/learning_study.json, {a.png}, {a.md} in {results['wall_seconds']:.0f}s"
    )
    tmp.cleanup()
    return results


def header(results: dict[str, Any]) -> str:
    """Command, date and wall time of each study invocation behind ``results``."""
    sources = results.get("sources") or [results]
    return "".join(
        f"Command: `{src['command']}`  \nDate: {src['date']}, wall time {src['wall_seconds']:.0f} s\n\n"
        for src in sources
    )


def write_outputs(results: dict[str, Any], a: argparse.Namespace) -> None:
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "learning_study.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    plot(results, Path(a.png))
    md = Path(a.md)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(header(results) + markdown_table(results), encoding="utf-8")


#: What two invocations must share for their runs of one environment to be merged into one table.
SAME_STUDY = ("setting", "eval_seeds", "num_eval_seeds", "baseline")
#: Settings that may differ between merged invocations (which seeds and conditions each one ran).
PER_INVOCATION = ("train_seeds", "conditions")


def pick_lr(paths: Sequence[str]) -> tuple[float, list[tuple[float, float, float]]]:
    """The pilots' rule: among pilot results files (one run each, evaluated on the pilot seeds, never on the
    held-out ones), the learning rate with the highest success after training; ties go to the higher mean
    success of the training rounds, then to the smaller rate. Returns it and ``(lr, success, training success)``
    per file."""
    table, seen = [], set()
    for p in paths:
        res = json.loads(Path(p).read_text(encoding="utf-8"))
        envs = res["envs"]
        if len(envs) != 1 or len(next(iter(envs.values()))["runs"]) != 1:
            raise SystemExit(f"{p}: a pilot results file holds one environment and one run")
        ((name, env),) = envs.items()
        (run,) = env["runs"]
        if max(env["eval_seeds"]) >= HELD_OUT_SEED:
            raise SystemExit(f"{p}: pilots must be evaluated below the held-out seeds ({HELD_OUT_SEED}..)")
        seen.add((name, tuple(env["eval_seeds"]), res["settings"]["max_steps"]))
        train = sum(c["success"] for c in run["curve"]) / max(1, len(run["curve"]))
        table.append((float(res["settings"]["learning_rate"]), run["after"]["success"]["rate"], train))
    if not table:
        raise SystemExit("--pick-lr needs pilot results files")
    if len(seen) != 1:
        raise SystemExit(f"--pick-lr: the pilots differ in environment, pilot seeds or steps: {sorted(seen)}")
    best = max(table, key=lambda t: (t[1], t[2], -t[0]))
    return best[0], table


def _shared_settings(settings: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (settings or {}).items() if k not in PER_INVOCATION}


def merge(paths: Sequence[str]) -> dict[str, Any]:
    """Results of several invocations as one: environments side by side, and the runs of one environment split
    over invocations (e.g. one per training seed, run in parallel) joined, when they share the setting, the
    held-out seeds and the training settings. The untrained model's evaluation is taken from the invocation
    that ran it (two that both ran it must agree)."""
    merged: dict[str, Any] = {"sources": [], "envs": {}}
    for p in paths:
        res = json.loads(Path(p).read_text(encoding="utf-8"))
        for src in res.get("sources") or [res]:
            merged["sources"].append({k: src[k] for k in ("command", "date", "wall_seconds")})
        for name, env in res["envs"].items():
            env = {"settings": res.get("settings"), **env}
            have = merged["envs"].get(name)
            if have is None:
                merged["envs"][name] = env
                continue
            differ = [k for k in SAME_STUDY if have.get(k) != env.get(k)]
            if _shared_settings(have["settings"]) != _shared_settings(env["settings"]):
                differ.append("settings")
            if differ:
                raise SystemExit(
                    f"{p}: {name} differs from an earlier file in {', '.join(differ)}; cannot merge"
                )
            if env.get("untrained") is not None:
                if have.get("untrained") is not None and have["untrained"] != env["untrained"]:
                    raise SystemExit(
                        f"{p}: {name}: the untrained model's evaluation differs from an earlier file"
                    )
                have["untrained"] = env["untrained"]
                have["untrained_eval_wall_seconds"] = env.get("untrained_eval_wall_seconds")
            seen = {(r["seed"], r["condition"]) for r in have["runs"]}
            twice = sorted(
                f"{c} seed {sd}" for sd, c in seen & {(r["seed"], r["condition"]) for r in env["runs"]}
            )
            if twice:
                raise SystemExit(f"{p}: {name}: runs already in an earlier file: {', '.join(twice)}")
            have["runs"] = have["runs"] + env["runs"]
            st = have["settings"] = dict(have["settings"])
            st["train_seeds"] = sorted({*st["train_seeds"], *env["settings"]["train_seeds"]})
            st["conditions"] = {**st["conditions"], **env["settings"]["conditions"]}
    for env in merged["envs"].values():  # seeds outermost, as one invocation orders them
        env["runs"].sort(key=lambda r: (r["seed"], r["condition"]))
        if "constant_actions" not in env and env.get("setting", {}).get("env"):  # results of an older version
            first, last = env["eval_seeds"]
            env["constant_actions"] = constant_actions(env["setting"], range(first, last + 1))
    return merged


if __name__ == "__main__":
    main()
