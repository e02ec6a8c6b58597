"""Does training learn the task, or only the answer format? A warm start, then RL, against chance on held-out seeds.

Version 2 (``docs/learning-study.md``). For each environment setting and training seed:

1. **Warm starts** (``llmgym-sft`` in process, :func:`llm_gym.trainer.sft.train_sft`): supervised fine-tuning on
   episodes of the random valid-action policy (``random``: the answer format without a policy) or of a partial
   expert (``partial``: a share of solver episodes, the rest random; ``expert``: all solver), played on seeds
   ``50000 + 1000 x seed ..`` (disjoint from the held-out seeds, checked), then evaluated on the held-out seeds.
2. **RL runs** (``llmgym-train`` in process) from a warm start (or from the base model: ``none``, version 1) with
   or without the SNR filter, at equal generation budget (P seeds x G rollouts per step), then evaluated on the
   held-out seeds. A run is named ``RECIPE:FILTER`` (``random:no_filter``, ``partial:snr_top_p_0.9``, ...).

Reported with Wilson 95% intervals, on the same held-out seeds and limits: the untrained model, every warm start,
every RL run, the random valid-action policy, every constant answer and the solver optimum; the training curve
of each RL run; episodes per CPU-hour of training and evaluation. A run is a **positive result** when its success
interval lies wholly above the random policy's, the best constant answer's and its own warm start's.

Every part (the untrained evaluation, each warm start, each RL run) is saved in ``--work-dir`` as it finishes;
rerunning the same command skips finished parts (resumable by part). Outputs (``learning_study.json``, the PNG and
the markdown tables) go to ``--out-dir`` (default: ``WORK_DIR/out``); ``--publish`` writes them into ``docs/``
(never with ``--quick``).

    OMP_NUM_THREADS=1 python benchmarks/learning_study.py --quick --work-dir /tmp/ls_quick   # tiny model, seconds
    # the whole protocol (pilots on pilot seeds, then the study in two lanes, merged and published):
    bash benchmarks/learning_study_protocol.sh /tmp/learning_study
    # one piece by hand: FrozenLake, training seed 0, the default runs, 128 held-out seeds
    OMP_NUM_THREADS=1 python benchmarks/learning_study.py --envs FrozenLake --train-seeds 0 --bf16 \\
        --work-dir /tmp/ls/work

``--pilot-sft`` runs only the warm-start learnability pilots (``--ws-lrs``, evaluated on pilot seeds after each
of ``--sft-eval-steps``); ``--pick-sft`` applies their rule. ``--train-args`` passes extra flags to every
``llmgym-train`` run (shared-prefix training is already on by default where it is exact).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import math
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline, single-threaded; before torch)
from llm_gym.trainer.resolve import has_gpu  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from llm_gym.agent.baselines import (  # noqa: E402
    NoBaseline,
    baseline_success,
    constant_action_success,
    episode_outcomes,
    format_outcomes,
    format_rate,
)
from llm_gym.agent.records import read_records  # noqa: E402

#: First held-out evaluation seed: far from the training seeds (train_seed 10000 + k * 1000 + s * P + g),
#: the warm-start data seeds (50000 + k * 1000 ..), RAGEN's validation seeds (123..) and the pilot seeds (5000..).
HELD_OUT_SEED = 200_000
#: First pilot evaluation seed (every choice of the study is made on these).
PILOT_SEED = 5000
#: First warm-start data seed of training seed k: WARM_START_SEED + 1000 * k.
WARM_START_SEED = 50_000
ROOT = Path(__file__).resolve().parents[1]


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

#: RL conditions at equal generation budget: the filter only decides which groups enter the update.
CONDITIONS: dict[str, list[str]] = {
    "no_filter": ["--filter_strategy", "off"],
    "snr_top_p_0.9": ["--filter_strategy", "top_p", "--filter_value", "0.9"],
}
#: Warm-start recipes: the share of solver episodes in the data (None: no warm start, RL from the base model).
WARM_STARTS: dict[str, float | None] = {"none": None, "random": 0.0, "partial": 0.5, "expert": 1.0}
#: (a) random-valid warm start -> RL; (b) partial expert warm start -> RL (beside the warm start alone);
#: (c) within the better recipe, the SNR filter against none.
DEFAULT_RUNS = ("random:no_filter", "partial:no_filter", "partial:snr_top_p_0.9")


def parse_run(spec: str) -> tuple[str, str]:
    """``RECIPE:FILTER`` -> ``(recipe, filter)``; a bare filter name means no warm start (version 1)."""
    recipe, _, filt = spec.rpartition(":")
    recipe = recipe or "none"
    if recipe not in WARM_STARTS or filt not in CONDITIONS:
        raise SystemExit(
            f"--runs: {spec!r} is not RECIPE:FILTER with RECIPE in {list(WARM_STARTS)} and FILTER in {list(CONDITIONS)}"
        )
    return recipe, filt


def run_name(recipe: str, filt: str) -> str:
    """The run's ``condition`` in the results (version 1's filter name when there is no warm start)."""
    return filt if recipe == "none" else f"{recipe}:{filt}"


def ws_key(recipe: str, seed: int) -> str:
    return f"{recipe} seed {seed}"


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


def study_chat(a: argparse.Namespace) -> Any:
    """The chat of every run and evaluation of this invocation."""
    from llm_gym.agent.chat import ChatFormat

    if a.demonstration == "none":
        return ChatFormat(include_instructions=not a.no_instructions)
    return ChatFormat(
        one_shot=True, demonstration=a.demonstration, include_instructions=not a.no_instructions
    )


def chat_args(chat: Any) -> list[str]:
    """``llmgym-train`` flags that show the model ``chat``."""
    return [
        "--one_shot_example", str(chat.one_shot),
        "--demonstration", chat.demonstration,
        "--include_instructions", str(chat.include_instructions),
    ]  # fmt: skip


def held_out_eval(
    model: str, setting: EnvSetting, seeds: Sequence[int], chat: Any, *, dtype: str = "float32"
) -> dict[str, Any]:
    """Play ``seeds`` once each with ``model`` at temperature 0.5 (RAGEN's validation setting) in ``chat``, through
    :class:`HFPolicy` (one code path and one sampling stream for every model), and summarise: success, valid
    answers, success among valid, and the executed actions (``trainer.warm_start.evaluate_model``)."""
    from llm_gym.trainer.warm_start import evaluate_model

    return evaluate_model(
        model,
        setting.env,
        seeds,
        env_kwargs=setting.env_kwargs_with_limits(),
        chat=chat,
        temperature=0.5,
        max_new_tokens=setting.max_new_tokens,
        dtype=dtype,
    )


def warm_start_rows(
    setting: Any, recipe: str, seed: int, a: argparse.Namespace, chat: Any
) -> tuple[list[dict], float]:
    """The recipe's warm-start episodes for training seed ``seed``: ``a.ws_episodes`` seeds from
    ``WARM_START_SEED + 1000 x seed``, a share of them played by the solver (the recipe's, or ``--partial-fraction``); and that share."""
    from llm_gym.agent.export import export_episodes

    fraction = WARM_STARTS[recipe] if recipe != "partial" else a.partial_fraction
    first = WARM_START_SEED + 1000 * seed
    rows = export_episodes(
        setting.env,
        range(first, first + a.ws_episodes),
        env_kwargs=setting.env_kwargs_with_limits(),
        chat=chat,
        expert_fraction=fraction,
        rng_seed=seed,
    ).rows
    return rows, fraction


def part(path: Path, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A finished part's saved result, or ``compute()`` saved (atomically) for the next invocation."""
    from llm_gym.safe_io import atomic_write_text

    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=1) + "\n")
    return result


#: What each warm start's results keep of the SFT run's summary.
SFT_KEYS = ("settings", "steps", "train_seconds", "train_cpu_seconds", "steps_per_second", "tokens_per_second",
            "tokens_per_cpu_second", "loss_first", "loss_last", "loss_curve")  # fmt: skip


def warm_start_part(
    setting: EnvSetting,
    recipe: str,
    seed: int,
    *,
    model: str,
    folder: Path,
    a: argparse.Namespace,
    chat: Any,
    eval_seeds: Sequence[int],
    eval_dtype: str,
) -> dict[str, Any]:
    """Export the recipe's episodes, fine-tune (data seeds checked against the held-out seeds), evaluate on the
    held-out seeds. The model stays in ``folder/final`` for the RL runs."""
    from llm_gym.trainer.config import LLMGymSFTConfig
    from llm_gym.trainer.sft import train_sft

    from llm_gym.agent.export import write_jsonl

    rows, fraction = warm_start_rows(setting, recipe, seed, a, chat)
    if folder.exists():  # an unfinished part: start it again
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    write_jsonl(rows, folder / "data.jsonl")
    config = LLMGymSFTConfig(
        output_dir=str(folder),
        data=str(folder / "data.jsonl"),
        eval_seed=eval_seeds[0],
        num_eval_seeds=len(eval_seeds),
        learning_rate=a.ws_lr,
        max_steps=a.ws_random_steps if recipe == "random" else a.ws_steps,
        per_device_train_batch_size=a.ws_micro_batch,
        gradient_accumulation_steps=a.ws_batch // a.ws_micro_batch,
        bf16=a.bf16,
        use_cpu=not has_gpu(),
        gradient_checkpointing=a.gradient_checkpointing,
        seed=seed,
        logging_steps=max(1, a.ws_steps // 20),
        disable_tqdm=True,
    )
    sft = train_sft(config, model, rows)
    t0, c0 = time.perf_counter(), time.process_time()
    ev = held_out_eval(str(folder / "final"), setting, eval_seeds, chat, dtype=eval_dtype)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    data = sft["data"]
    return {
        "recipe": recipe,
        "seed": seed,
        "expert_fraction": fraction,
        "data": {
            k: data.get(k) for k in ("rows", "policies", "seeds", "tokens", "trained_tokens", "mean_tokens")
        },
        "sft": {k: sft[k] for k in SFT_KEYS},
        "eval": ev,
        "eval_wall_seconds": round(wall, 1),
        "eval_cpu_seconds": round(cpu, 1),
        "eval_episodes_per_cpu_hour": round(len(eval_seeds) / cpu * 3600) if cpu else None,
    }


def rl_part(
    setting: EnvSetting,
    recipe: str,
    filt: str,
    seed: int,
    *,
    model: str,
    run_dir: Path,
    common: Sequence[str],
    max_steps: int,
    eval_seeds: Sequence[int],
    chat: Any,
    eval_dtype: str,
    rollouts_per_step: int,
) -> dict[str, Any]:
    """One ``llmgym-train`` run (no in-training evaluation) from ``model``, then :func:`held_out_eval` of its final
    model; returns the training curve, the evaluation and the speed (raises on a failed run)."""
    from llm_gym.trainer.cli import main as train_main

    if run_dir.exists():  # an unfinished part: start it again
        shutil.rmtree(run_dir)
    argv = [
        *setting.train_args(),
        *CONDITIONS[filt],
        *chat_args(chat),
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
    t0, c0 = time.perf_counter(), time.process_time()
    rc = train_main(argv)
    train_wall, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    if rc != 0:
        raise RuntimeError(f"llmgym-train exited with {rc}: {shlex.join(argv)}")
    curve = split_records(read_records(run_dir / "episodes.jsonl"))
    t1, c1 = time.perf_counter(), time.process_time()
    after = held_out_eval(str(run_dir / "final"), setting, eval_seeds, chat, dtype=eval_dtype)
    eval_wall, eval_cpu = time.perf_counter() - t1, time.process_time() - c1
    episodes = rollouts_per_step * max_steps
    return {
        "condition": run_name(recipe, filt),
        "recipe": recipe,
        "filter": filt,
        "seed": seed,
        "warm_start": ws_key(recipe, seed) if recipe != "none" else None,
        "argv": shlex.join(argv),
        "train_wall_seconds": round(train_wall, 1),
        "eval_wall_seconds": round(eval_wall, 1),
        "train_episodes": episodes,
        "train_cpu_seconds": round(train_cpu, 1),
        "eval_cpu_seconds": round(eval_cpu, 1),
        # CPU time of this process (one torch thread): what contention from other processes does not change
        "train_episodes_per_cpu_hour": round(episodes / train_cpu * 3600) if train_cpu else None,
        "eval_episodes_per_cpu_hour": round(len(eval_seeds) / eval_cpu * 3600) if eval_cpu else None,
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


def positive(env: dict[str, Any], run: dict[str, Any]) -> bool | None:
    """Whether the run's success interval lies wholly above the random policy's, the best constant answer's and
    its own warm start's (None when the run has no warm start to compare with)."""
    lo = run["after"]["success"]["ci"][0]
    bars = []
    if env["baseline"].get("random"):
        bars.append(env["baseline"]["random"]["ci"][1])
    best = best_constant(env)
    if best:
        bars.append(best[1]["ci"][1])
    ws = (env.get("warm_start") or {}).get(run.get("warm_start") or "")
    if ws is None:
        return None
    bars.append(ws["eval"]["success"]["ci"][1])
    return lo > max(bars)


def markdown_table(results: dict[str, Any]) -> str:
    """One table per environment: the untrained model, each warm start and each RL run (success, valid answers,
    success among valid answers, ratio to the random valid-action baseline on the same held-out seeds, and
    whether the run is a positive result)."""
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
            f"and limits: {ref}. Intervals: Wilson 95%. *Positive*: the success interval lies wholly above the "
            "random policy's, the best constant answer's and the run's own warm start's.",
            "",
            "| model | success | valid answers | success among valid | success / random | positive |",
            "|---|---|---|---|---|---|",
        ]
        rows: list[tuple[str, dict[str, Any] | None, str]] = [("untrained", env.get("untrained"), "")]
        for key, ws in (env.get("warm_start") or {}).items():
            steps = ws.get("sft", {}).get("steps")
            rows.append((f"warm start {key} ({steps} SFT steps)", ws["eval"], ""))
        for r in env["runs"]:
            flag = positive(env, r)
            rows.append(
                (
                    f"{r['condition']}, seed {r['seed']}, after {env['settings']['max_steps']} RL steps",
                    r["after"],
                    "-" if flag is None else ("**yes**" if flag else "no"),
                )
            )
        for label, ev, flag in rows:
            if ev is None:
                continue
            rate = ev["success"]["rate"]
            ratio = f"{rate / b['random']['rate']:.2f}" if b["random"] and b["random"]["rate"] else "-"
            out.append(
                f"| {label} | {_fmt(ev['success'])} | {_fmt(ev['valid'])} | {_fmt(ev['success_given_valid'])} "
                f"| {ratio} | {flag} |"
            )
        out.append("")
        speed = [
            r.get("train_episodes_per_cpu_hour") for r in env["runs"] if r.get("train_episodes_per_cpu_hour")
        ]
        if speed:
            out.append(
                f"RL training: {min(speed)}-{max(speed)} episodes per CPU-hour (one process, one thread)."
            )
            out.append("")
    return "\n".join(out)


def plot(results: dict[str, Any], path: Path) -> None:
    """Success and valid-answer rate of the training rounds vs step, one line per run; the random baseline's
    interval as a band; held-out evaluations (untrained and warm starts at step 0, each run at the end) as dots
    with 95% CIs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(results["envs"])
    fig, axes = plt.subplots(2, len(envs), figsize=(5.5 * len(envs), 6.5), squeeze=False)
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]

    def dot(
        ax: Any, x: float, s: dict[str, Any], color: str, label: str | None = None, marker: str = "o"
    ) -> None:
        err = [[s["rate"] - s["ci"][0]], [s["ci"][1] - s["rate"]]]
        ax.errorbar([x], [s["rate"]], yerr=err, fmt=marker, ms=4, color=color, capsize=2, label=label)

    for j, env_name in enumerate(envs):
        env = results["envs"][env_name]
        steps, first_seed = env["settings"]["max_steps"], env["settings"]["train_seeds"][0]
        names = list(dict.fromkeys(r["condition"] for r in env["runs"]))
        colors = {n: palette[i % len(palette)] for i, n in enumerate(names)}
        recipes = list(dict.fromkeys(ws["recipe"] for ws in (env.get("warm_start") or {}).values()))
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
                dot(ax, -0.4, env["untrained"][key], "black", "untrained model (held-out)")
            for k, ws in enumerate((env.get("warm_start") or {}).values()):
                dot(ax, -0.2 + 0.1 * k, ws["eval"][key], palette[(len(names) + recipes.index(ws["recipe"])) % 6],
                    f"warm start {ws['recipe']}" if ws["seed"] == first_seed else None, marker="D")  # fmt: skip
            for k, r in enumerate(env["runs"]):
                c = colors[r["condition"]]
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
            ax.set_xlabel("RL step (lines: training rounds; dots: held-out eval, 95% CI)", fontsize=8)
            ax.grid(alpha=0.3)
        axes[0][j].legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ SFT pilots
class _EvalAt(TrainerCallback):
    """Plays the pilot seeds with the model being trained after the given optimizer steps (in bf16 autocast when
    training uses it) and appends the outcome to ``curve``."""

    def __init__(self, setting, seeds, chat, steps, curve, eval_seconds, label):  # noqa: ANN001
        self.setting, self.seeds, self.chat, self.steps = setting, seeds, chat, steps
        self.curve, self.eval_seconds, self.label = curve, eval_seconds, label

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):  # noqa: ANN001
        if state.global_step not in self.steps:
            return
        import torch
        from llm_gym.trainer.policies import HFPolicy, SamplingParams
        from llm_gym.trainer.warm_start import action_counts

        from llm_gym.agent.baselines import outcome_summary
        from llm_gym.agent.rollout import rollout

        t0, c0 = time.perf_counter(), time.process_time()
        torch.manual_seed(0)
        was_training = model.training
        s = self.setting
        policy = HFPolicy(model, processing_class, SamplingParams(0.5, 1.0, s.max_new_tokens), batch_size=32)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(args.bf16)):
            recs = rollout(s.env, self.seeds, policy, env_kwargs=s.env_kwargs_with_limits(), chat=self.chat)
        model.train(was_training)
        ev = {**outcome_summary(recs), "actions": action_counts(recs)}
        loss = next((h["loss"] for h in reversed(state.log_history) if "loss" in h), None)
        self.curve.append({"step": state.global_step, "loss": loss, **ev})
        self.eval_seconds[0] += time.perf_counter() - t0
        self.eval_seconds[1] += time.process_time() - c0
        print(f"[learning_study] pilot {self.label} step {state.global_step}: {format_outcomes(ev)}; "
              f"actions {ev['actions']} ({time.perf_counter() - t0:.0f}s)", flush=True)  # fmt: skip


def sft_pilot(
    setting: EnvSetting, a: argparse.Namespace, model: str, work: Path, chat: Any, eval_dtype: str
) -> dict[str, Any]:
    """Warm-start learnability on pilot seeds: for each ``--ws-lrs`` rate, fine-tune on the ``--pilot-recipe``
    data (training seed 7) and evaluate on the pilot seeds after each of ``--sft-eval-steps``; returns the curves
    and the speed. Never touches the held-out seeds."""
    from llm_gym.trainer.config import LLMGymSFTConfig
    from llm_gym.trainer.sft import train_sft

    from llm_gym.agent.export import write_jsonl

    seeds = list(range(a.eval_seed, a.eval_seed + a.num_eval_seeds))
    if max(seeds) >= HELD_OUT_SEED:
        raise SystemExit(
            f"--pilot-sft evaluates on pilot seeds: keep --eval-seed + --num-eval-seeds below {HELD_OUT_SEED}"
        )
    rows, fraction = warm_start_rows(setting, a.pilot_recipe, 7, a, chat)  # pilot data: training seed 7
    eval_at = sorted(set(a.sft_eval_steps))
    pilots = []
    for lr in a.ws_lrs:
        folder = work / f"pilot-{setting.name}-{a.pilot_recipe}-lr{lr:g}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        write_jsonl(rows, folder / "data.jsonl")
        curve: list[dict[str, Any]] = []
        eval_seconds = [0.0, 0.0]  # wall, CPU
        callback = _EvalAt(
            setting, seeds, chat, set(eval_at), curve, eval_seconds, f"{setting.name} lr {lr:g}"
        )
        config = LLMGymSFTConfig(
            output_dir=str(folder),
            data=str(folder / "data.jsonl"),
            eval_seed=HELD_OUT_SEED,
            num_eval_seeds=a.num_held_out,
            learning_rate=lr,
            max_steps=max(eval_at),
            per_device_train_batch_size=a.ws_micro_batch,
            gradient_accumulation_steps=a.ws_batch // a.ws_micro_batch,
            bf16=a.bf16,
            use_cpu=not has_gpu(),
            gradient_checkpointing=a.gradient_checkpointing,
            seed=7,
            logging_steps=1,
            disable_tqdm=True,
        )
        sft = train_sft(config, model, rows, callbacks=[callback])
        shutil.rmtree(folder / "final", ignore_errors=True)  # pilots keep numbers, not models
        train_seconds = sft["train_seconds"] - eval_seconds[0]
        train_cpu = sft["train_cpu_seconds"] - eval_seconds[1]
        tokens = (sft["tokens_per_cpu_second"] or 0) * sft["train_cpu_seconds"]
        pilots.append(
            {
                "learning_rate": lr,
                "curve": curve,
                "loss_curve": sft["loss_curve"],
                "train_seconds": round(train_seconds, 1),
                "train_cpu_seconds": round(train_cpu, 1),
                "steps_per_cpu_second": sft["steps"] / train_cpu if train_cpu > 0 else None,
                "tokens_per_cpu_second": tokens / train_cpu if train_cpu > 0 else None,
                "eval_cpu_seconds": round(eval_seconds[1], 1),
                "data": sft["data"]["rows"],
                "mean_tokens": sft["data"]["mean_tokens"],
            }
        )
    return {
        "env": setting.name,
        "recipe": a.pilot_recipe,
        "expert_fraction": fraction,
        "eval_seeds": [seeds[0], seeds[-1]],
        "baseline": baseline_success(setting.env, seeds, setting.env_kwargs_with_limits()),
        "constant_actions": constant_actions(asdict(setting), seeds),
        "settings": {
            "batch": a.ws_batch,
            "micro_batch": a.ws_micro_batch,
            "bf16": a.bf16,
            "episodes": a.ws_episodes,
            "demonstration": a.demonstration,
            "include_instructions": not a.no_instructions,
        },  # fmt: skip
        "pilots": pilots,
    }


def pick_sft(paths: Sequence[str]) -> tuple[float, int, list[tuple[float, int, float]]]:
    """The warm-start pilots' rule: among the pilot files' (learning rate, step) points, the highest pilot success;
    ties go to fewer steps (cheaper), then the smaller rate. Returns ``(lr, steps, table)``."""
    table = []
    for p in paths:
        res = json.loads(Path(p).read_text(encoding="utf-8"))
        if max(res["eval_seeds"]) >= HELD_OUT_SEED:
            raise SystemExit(f"{p}: pilots must be evaluated below the held-out seeds ({HELD_OUT_SEED}..)")
        for pilot in res["pilots"]:
            for point in pilot["curve"]:
                table.append(
                    (float(pilot["learning_rate"]), int(point["step"]), float(point["success"]["rate"]))
                )
    if not table:
        raise SystemExit("--pick-sft needs pilot results files with evaluated steps")
    lr, steps, _ = max(table, key=lambda t: (t[2], -t[1], -t[0]))
    return lr, steps, table


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny random model, 1 step, 4 eval seeds (seconds)")
    p.add_argument("--model", default="smollm2", help="base model (default: offline SmolLM2-135M)")
    p.add_argument("--envs", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument(
        "--runs",
        nargs="+",
        default=list(DEFAULT_RUNS),
        help="RL runs as RECIPE:FILTER (recipes: none, random, partial, expert; filters: no_filter, "
        "snr_top_p_0.9); a bare FILTER is version 1's run without a warm start",
    )
    p.add_argument("--train-seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--max-steps", type=int, default=10, help="RL steps")
    p.add_argument("--num-prompts", type=int, default=4, help="P: seeds per RL step")
    p.add_argument("--num-generations", type=int, default=4, help="G: rollouts per seed")
    p.add_argument("--learning-rate", type=float, default=1e-5, help="RL learning rate")
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="rollouts per forward/backward pass (default: the whole round, P x G); the round is accumulated",
    )
    p.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 autocast in training (weights stay float32) and bf16 evaluation (on an AVX512-BF16 CPU: forward "
        "passes 2x faster)",
    )
    p.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute activations in the update (slower; needed for multi-turn batches on a small-memory box)",
    )
    ws = p.add_argument_group("warm start")
    ws.add_argument(
        "--ws-episodes", type=int, default=256, help="episodes of warm-start data per training seed"
    )
    ws.add_argument(
        "--ws-steps", type=int, default=60, help="optimizer steps of each expert or partial warm start"
    )
    ws.add_argument(
        "--ws-random-steps",
        type=int,
        default=20,
        help="optimizer steps of each random-valid warm start (the answer format only: learned within 10-20 steps)",
    )
    ws.add_argument("--ws-lr", type=float, default=1e-4, help="warm-start learning rate")
    ws.add_argument("--ws-batch", type=int, default=16, help="episodes per warm-start optimizer step")
    ws.add_argument("--ws-micro-batch", type=int, default=4, help="episodes per warm-start forward/backward")
    ws.add_argument(
        "--partial-fraction", type=float, default=0.5, help="share of solver episodes in the partial recipe"
    )
    chat = p.add_argument_group("chat")
    chat.add_argument(
        "--demonstration",
        default="none",
        choices=["none", "action", "solver", "several", "placeholder"],
        help="format demonstration of every prompt (none: a warm-started model needs none)",
    )
    chat.add_argument(
        "--no-instructions",
        action="store_true",
        help="compact prompts: no env instructions in the system message",
    )
    p.add_argument("--train-args", default="", help="extra llmgym-train flags for every RL run (one string)")
    p.add_argument(
        "--skip-untrained",
        action="store_true",
        help="do not evaluate the untrained model (another invocation on the same seeds does; see --merge)",
    )
    p.add_argument("--num-eval-seeds", type=int, default=128)
    p.add_argument("--eval-seed", type=int, default=HELD_OUT_SEED, help="first held-out evaluation seed")
    p.add_argument(
        "--env-eval-seeds",
        nargs="*",
        default=[],
        metavar="ENV=N",
        help="held-out seeds for one environment instead of --num-eval-seeds (e.g. FrozenLake=32)",
    )
    p.add_argument("--work-dir", default=None, help="finished parts and models (default: a temporary folder)")
    p.add_argument(
        "--out-dir", default=None, help="learning_study.json, PNG and table (default: WORK_DIR/out)"
    )
    p.add_argument("--png", default=None, help="default: OUT_DIR/learning_study.png")
    p.add_argument("--md", default=None, help="markdown table file (default: OUT_DIR/learning_study.md)")
    p.add_argument(
        "--publish",
        action="store_true",
        help="also write the results into docs/data/learning_study.{json,md} and docs/img/learning_study.png",
    )
    p.add_argument(
        "--merge", nargs="+", metavar="JSON", help="only merge earlier results files into one JSON/PNG/table"
    )
    p.add_argument(
        "--pick-lr",
        nargs="+",
        metavar="JSON",
        help="only print the RL learning rate that RL pilots (one results file per rate) choose; see pick_lr",
    )
    pilot = p.add_argument_group("warm-start pilots (pilot seeds only)")
    pilot.add_argument("--pilot-sft", action="store_true", help="only run the warm-start learnability pilots")
    pilot.add_argument("--ws-lrs", type=float, nargs="+", default=[1e-4], help="pilot learning rates")
    pilot.add_argument(
        "--sft-eval-steps", type=int, nargs="+", default=[25, 50, 100], help="pilot evaluations"
    )
    pilot.add_argument("--pilot-recipe", default="expert", choices=[k for k in WARM_STARTS if k != "none"])
    pilot.add_argument("--pick-sft", nargs="+", metavar="JSON", help="only print the pilots' lr and steps")
    a = p.parse_args(argv)
    a.num_held_out = 128
    try:
        a.env_eval_seeds = {k: int(v) for k, v in (item.split("=", 1) for item in a.env_eval_seeds)}
    except ValueError:
        raise SystemExit(f"--env-eval-seeds expects ENV=N items, got {a.env_eval_seeds}") from None
    a.run_specs = [parse_run(s) for s in a.runs]
    if a.quick:
        if a.publish:
            raise SystemExit("--quick results are never published into docs/")
        a.max_steps, a.num_eval_seeds, a.train_seeds, a.env_eval_seeds = 1, 4, a.train_seeds[:1], {}
        a.num_prompts, a.num_generations = 2, 2
        a.ws_episodes, a.ws_steps, a.ws_random_steps, a.ws_batch, a.ws_micro_batch = 4, 1, 1, 2, 2
        a.sft_eval_steps = [1]
    if a.max_steps < 1 or a.num_eval_seeds < 1 or a.num_prompts < 1 or a.num_generations < 2:
        raise SystemExit(
            "need --max-steps >= 1, --num-eval-seeds >= 1, --num-prompts >= 1, --num-generations >= 2"
        )
    if a.ws_batch % a.ws_micro_batch:
        raise SystemExit("--ws-micro-batch must divide --ws-batch")
    rollouts = a.num_prompts * a.num_generations
    a.micro_batch = rollouts if a.micro_batch is None else a.micro_batch
    if a.micro_batch < 1 or rollouts % a.micro_batch:
        raise SystemExit(f"--micro-batch must divide P x G = {rollouts}")
    return a


def _output_paths(a: argparse.Namespace, work: Path) -> None:
    a.out_dir = a.out_dir or str(work / "out")
    a.png = a.png or str(Path(a.out_dir) / "learning_study.png")
    a.md = a.md or str(Path(a.out_dir) / "learning_study.md")


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
    if a.pick_sft:
        lr, steps, table = pick_sft(a.pick_sft)
        for row in table:
            print(
                f"[learning_study] warm-start pilot lr {row[0]:g} step {row[1]}: pilot-seed success {row[2]:.3f}"
            )
        print(f"{lr:g} {steps}")
        return {"learning_rate": lr, "steps": steps, "pilots": table}
    tmp = tempfile.TemporaryDirectory(prefix="learning_study_")
    work = Path(a.work_dir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    _output_paths(a, work)
    if a.merge:
        results = merge(a.merge)
        write_outputs(results, a)
        print(
            f"[learning_study] merged {len(a.merge)} files into {a.out_dir}/learning_study.json, {a.png}, {a.md}"
        )
        return results
    t0 = time.perf_counter()
    model = a.model
    if a.quick:
        from tests._tiny import build_tiny_model

        model = (
            str(work / "tiny-model")
            if (work / "tiny-model" / "config.json").is_file()
            else build_tiny_model(work / "tiny-model")
        )
    chat = study_chat(a)
    eval_dtype = "bfloat16" if a.bf16 else "float32"
    if a.pilot_sft:
        out = {}
        for env_name in a.envs:
            res = sft_pilot(SETTINGS[env_name], a, model, work, chat, eval_dtype)
            path = Path(a.out_dir) / f"sft_pilot_{env_name}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
            print(f"[learning_study] wrote {path}")
            out[env_name] = res
        tmp.cleanup()
        return out
    extra = shlex.split(a.train_args)
    common = [
        "--num_prompts", str(a.num_prompts), "--num_generations", str(a.num_generations),
        "--learning_rate", str(a.learning_rate), "--mi_every", "0", "--save_strategy", "no",
        "--report_to", "none", "--disable_tqdm", "True", "--gradient_checkpointing", str(a.gradient_checkpointing),
        "--per_device_train_batch_size", str(a.micro_batch),
        "--gradient_accumulation_steps", str(a.num_prompts * a.num_generations // a.micro_batch),
        "--bf16", str(a.bf16), *extra,
    ]  # fmt: skip
    recipes = sorted({r for r, _ in a.run_specs if r != "none"}, key=list(WARM_STARTS).index)
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
            "conditions": {run_name(r, f): CONDITIONS[f] for r, f in a.run_specs},
            "warm_start": {
                "recipes": {r: (a.partial_fraction if r == "partial" else WARM_STARTS[r]) for r in recipes},
                "episodes": a.ws_episodes,
                "steps": a.ws_steps,
                "random_steps": a.ws_random_steps,
                "learning_rate": a.ws_lr,
                "batch": a.ws_batch,
                "micro_batch": a.ws_micro_batch,
            },
            "chat": {"demonstration": a.demonstration, "include_instructions": not a.no_instructions},
            "common_args": common,
        },
        "envs": {},
    }
    for env_name in a.envs:
        s = SETTINGS[env_name]
        n_eval = a.env_eval_seeds.get(env_name, a.num_eval_seeds)
        eval_seeds = list(range(a.eval_seed, a.eval_seed + n_eval))
        parts = work / env_name
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
            "warm_start": {},
        }
        results["envs"][env_name] = env_res
        rb = base["random"]["rate"] if base["random"] else math.nan
        if not a.skip_untrained:

            def untrained(s: EnvSetting = s, seeds: list[int] = eval_seeds) -> dict[str, Any]:
                t1 = time.perf_counter()
                ev = held_out_eval(model, s, seeds, chat, dtype=eval_dtype)
                return {"eval": ev, "wall_seconds": round(time.perf_counter() - t1, 1)}

            u = part(parts / "untrained.json", untrained)
            env_res["untrained"], env_res["untrained_eval_wall_seconds"] = u["eval"], u["wall_seconds"]
            print(
                f"[learning_study] {env_name} untrained: {format_outcomes(env_res['untrained'])} "
                f"(random valid {rb:.3f}), {u['wall_seconds']:.0f}s",
                flush=True,
            )
        # seeds outermost, so that a study cut short still has every run at equal numbers of seeds
        for seed in a.train_seeds:
            for recipe in recipes:
                folder = parts / f"ws-{recipe}-seed{seed}"
                ws = part(folder / "part.json", functools.partial(
                    warm_start_part, s, recipe, seed, model=model, folder=folder, a=a, chat=chat,
                    eval_seeds=eval_seeds, eval_dtype=eval_dtype))  # fmt: skip
                env_res["warm_start"][ws_key(recipe, seed)] = ws
                print(
                    f"[learning_study] {env_name} warm start {recipe} seed {seed}: {format_outcomes(ws['eval'])}; "
                    f"{ws['sft']['steps']} SFT steps in {ws['sft']['train_seconds']:.0f}s",
                    flush=True,
                )
            for recipe, filt in a.run_specs:
                start = model if recipe == "none" else str(parts / f"ws-{recipe}-seed{seed}" / "final")
                run_dir = parts / f"{recipe}-{filt}-seed{seed}"
                r = part(run_dir.with_name(run_dir.name + ".json"), functools.partial(
                    rl_part, s, recipe, filt, seed, model=start, run_dir=run_dir, common=common,
                    max_steps=a.max_steps, eval_seeds=eval_seeds, chat=chat, eval_dtype=eval_dtype,
                    rollouts_per_step=a.num_prompts * a.num_generations))  # fmt: skip
                env_res["runs"].append(r)
                after = r["after"]["success"]["rate"]
                print(
                    f"[learning_study] {env_name} {r['condition']} seed {seed}: {format_outcomes(r['after'])}; "
                    f"after/random {after / rb if rb else math.nan:.2f}; train {r['train_wall_seconds']:.0f}s, "
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
        f"Command: `{src['command']}`  \nDate: {src['date']}, wall time {src.get('wall_seconds', 0):.0f} s\n\n"
        for src in sources
    )


#: Where ``--publish`` writes (never ``--quick``; tests never write here).
PUBLISHED = {"json": ROOT / "docs/data/learning_study.json", "md": ROOT / "docs/data/learning_study.md",
             "png": ROOT / "docs/img/learning_study.png"}  # fmt: skip


def write_outputs(results: dict[str, Any], a: argparse.Namespace) -> None:
    targets = [(Path(a.out_dir) / "learning_study.json", Path(a.md), Path(a.png))]
    if a.publish:
        targets.append((PUBLISHED["json"], PUBLISHED["md"], PUBLISHED["png"]))
    for js, md, png in targets:
        js.parent.mkdir(parents=True, exist_ok=True)
        js.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        plot(results, png)
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(header(results) + markdown_table(results), encoding="utf-8")


#: What two invocations must share for their runs of one environment to be merged into one table.
SAME_STUDY = ("setting", "eval_seeds", "num_eval_seeds", "baseline")
#: Settings that may differ between merged invocations (which seeds and conditions each one ran).
PER_INVOCATION = ("train_seeds", "conditions", "warm_start")


def pick_lr(paths: Sequence[str]) -> tuple[float, list[tuple[float, float, float]]]:
    """The RL pilots' rule: among pilot results files (one run each, evaluated on the pilot seeds, never on the
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
    """Results of several invocations as one: environments side by side, and the runs (and warm starts) of one
    environment split over invocations (e.g. one per training seed, run in parallel) joined, when they share the
    setting, the held-out seeds and the training settings. The untrained model's evaluation is taken from the
    invocation that ran it (two that both ran it must agree)."""
    merged: dict[str, Any] = {"sources": [], "envs": {}}
    for p in paths:
        res = json.loads(Path(p).read_text(encoding="utf-8"))
        for src in res.get("sources") or [res]:
            merged["sources"].append({k: src.get(k) for k in ("command", "date", "wall_seconds")})
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
            for key, ws in (env.get("warm_start") or {}).items():
                known = (have.setdefault("warm_start", {}) or {}).get(key)
                if known is not None and known != ws:
                    raise SystemExit(f"{p}: {name}: warm start {key} differs from an earlier file")
                have["warm_start"][key] = ws
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
