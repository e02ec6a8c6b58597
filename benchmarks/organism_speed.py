"""Episodes per CPU-second of the model organism in whole GRPO steps: our defaults vs the plain path, same run.

For each environment (the learning study's 3-turn deterministic 3x3 CoordFrozenLake with a 1,024-token episode
budget, and Bandit), one ``LLMGymGRPOTrainer`` on ``organism-m`` (the 128-hidden organism, random weights) runs
real training steps through ``Trainer.train`` at the organism probe's settings, which the organism profile
(``trainer/profiles/organism/bandit.yaml``) holds: the compact chat (no instructions, no demonstration turn, no
reasoning block, 12 new tokens a turn), 16 seeds x 8 rollouts = 128 episodes a step in one micro-batch, one
optimizer step a round, lr 1e-3, temperature 1.0, top_p 0.9, no entropy bonus, no SNR filter (``--model`` takes
a model folder too, e.g. a warm start). The steps alternate between

* ours: today's defaults, prefix sharing (``use_prefix_sharing``) and the turn cache (``use_turn_cache``) on;
* plain: both off (TRL's padded forwards, every turn re-prefilled from the start),

after one warm-up step of each (not counted); the order of each pair alternates, so load from other processes
and the policy's drift hit both. A step's cost is this process's CPU time (``time.process_time``, with
``OMP_NUM_THREADS=1``), which other jobs on a loaded machine inflate far less than wall time (two runs here
differed by 4-7%); wall time is printed beside it. The breakdown wraps the trainer's public hooks: generation (``rollout_func``: the multi-turn episodes), loss forward
(``compute_loss``), backward (``accelerator.backward``), optimizer (``optimizer.step``), and the rest (scoring,
advantages, batching, clipping).

The untrained organism writes the full ``max_new_tokens`` every turn and its answers are invalid, so FrozenLake
episodes run all 3 turns: each step costs what a run's first steps cost (the probe's smoke run), more than a
warm-started run whose replies are shorter; the sampled tokens per episode are printed so that runs compare.
The last line reads ``organism speed (organism-m): FrozenLake 7.2 episodes/CPU-s (1.51x plain, 0.45x the
probe's 16), Bandit 176.6 episodes/CPU-s (3.14x plain)``.

    OMP_NUM_THREADS=1 python benchmarks/organism_speed.py --quick      # tiny random model, seconds
    OMP_NUM_THREADS=1 nice -n 5 python benchmarks/organism_speed.py --steps 3 --json /tmp/organism_speed.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline env vars and repo path, before any torch import)
from prefix_sharing import make_trainer  # noqa: E402
from turn_cache import model_folder  # noqa: E402

#: FrozenLake's rate in the organism probe (m128, 128 episodes in 8 CPU-s per step) and the goal over it.
PROBE_RATE = 16.0
GOAL = 3.0
PATHS = ("ours", "plain")
PHASES = ("generation", "loss_forward", "backward", "optimizer")

#: The organism profile's settings for a GRPO round (batch, optimizer, sampling), used for every environment.
RUN_KEYS = (
    "num_prompts",
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "lr_scheduler_type",
    "entropy_coef",
    "scale_rewards",
    "top_p",
    "temperature",
    "gradient_checkpointing",
)
#: The profile's chat (the probe's: no instructions, no demonstration, no reasoning, 12 new tokens a turn), used
#: for every environment.
CHAT_KEYS = ("think", "include_instructions", "one_shot_example", "max_new_tokens")
#: Bandit's episode length settings from the same profile (FrozenLake keeps the learning study's 3 turns).
LENGTH_KEYS = ("max_completion_length", "max_turns", "max_actions_per_turn", "max_actions")


def profile_settings(env: str) -> dict[str, Any]:
    """The organism profile's round and chat settings, plus its episode lengths for Bandit (its own env)."""
    from llm_gym.trainer.resolve import load_profile, profile_path

    path = profile_path("Bandit", "organism")
    assert path is not None
    data = load_profile(path)
    keys = RUN_KEYS + CHAT_KEYS + (LENGTH_KEYS if env == "Bandit" else ())
    return {k: data[k] for k in keys if k in data}


class PhaseClock:
    """CPU seconds spent inside wrapped callables, per phase, since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.episodes = self.sampled_tokens = self.turns = 0
        self.reset()

    def reset(self) -> None:
        self.spent = dict.fromkeys(PHASES, 0.0)
        self.episodes = self.sampled_tokens = self.turns = 0

    def wrap(self, phase: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[phase] += time.process_time() - c0

        return timed


class TimedRollout:
    """The trainer's ``rollout_func`` with its CPU time and output sizes counted (attributes pass through, so
    ``trainer.last_rollout`` still reads the wrapped one's ``last``)."""

    def __init__(self, inner: Any, clock: PhaseClock) -> None:
        self._inner = inner
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        c0 = time.process_time()
        out = self._inner(*args, **kwargs)
        self._clock.spent["generation"] += time.process_time() - c0
        self._clock.episodes += len(out["completion_ids"])
        self._clock.sampled_tokens += sum(sum(m) for m in out["env_mask"])
        self._clock.turns += sum(out["env_turns"])
        return out


def step_clock(tr: Any, plan: list[str], clock: PhaseClock, records: list[dict[str, Any]]) -> Any:
    """A callback that switches ``tr`` to each step's path in ``plan`` and appends the step's costs to
    ``records``."""
    from transformers import TrainerCallback

    sharing, cache = tr.prefix_sharing, tr.turn_cache

    class StepClock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.path = plan[state.global_step]
            tr.prefix_sharing = sharing if self.path == "ours" else None
            tr.turn_cache = cache if self.path == "ours" else None
            clock.reset()
            self.used = (sharing.tokens.processed, cache.stats.prefill)
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.o0 = time.process_time()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.spent["optimizer"] += time.process_time() - self.o0

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            cpu, wall = time.process_time() - self.c0, time.perf_counter() - self.t0
            rec = {"path": self.path, "step": state.global_step - 1, "cpu_s": cpu, "wall_s": wall}
            rec.update({f"{p}_s": clock.spent[p] for p in PHASES})
            rec["rest_s"] = cpu - sum(clock.spent.values())
            rec.update(episodes=clock.episodes, sampled_tokens=clock.sampled_tokens, turns=clock.turns)
            # tokens that went through the shared loss pass and the turn cache: none on the plain path
            rec["shared_loss_tokens"] = sharing.tokens.processed - self.used[0]
            rec["turn_cache_prefill"] = cache.stats.prefill - self.used[1]
            records.append(rec)
            print(
                f"  step {rec['step']} {self.path:<5}: {cpu:.2f} CPU-s ({wall:.1f}s wall), "
                f"{clock.episodes / cpu:.1f} episodes/CPU-s",
                file=sys.stderr,
                flush=True,
            )

    return StepClock()


def plan_steps(steps: int) -> list[str]:
    """One warm-up step of each path, then ``steps`` of each in pairs whose order alternates."""
    plan = list(PATHS)
    for i in range(steps):
        plan += list(PATHS) if i % 2 else list(reversed(PATHS))
    return plan


def bench(env: str, a: argparse.Namespace) -> dict[str, Any]:
    from learning_study import SETTINGS

    setting = SETTINGS[env]
    folder = a.model_dir or model_folder(a.model, setting)
    over = profile_settings(env)
    if a.quick:
        over.update(num_prompts=2, num_generations=4, per_device_train_batch_size=8)
    plan = plan_steps(a.steps)
    over.update(max_steps=len(plan), logging_steps=len(plan), use_turn_cache=True)
    budget = over.pop("max_completion_length", a.budget)
    group, prompts = over["num_generations"], over["num_prompts"]
    tr = make_trainer(
        folder, setting, group, prompts, prompts * group, quick=True, max_completion_length=budget, **over
    )
    if tr.prefix_sharing is None or tr.turn_cache is None:
        raise SystemExit(f"prefix sharing or the turn cache is off for {env} (see the log above)")
    clock = PhaseClock()
    tr.rollout_func = TimedRollout(tr.rollout_func, clock)
    tr.compute_loss = clock.wrap("loss_forward", tr.compute_loss)
    tr.accelerator.backward = clock.wrap("backward", tr.accelerator.backward)
    records: list[dict[str, Any]] = []
    tr.add_callback(step_clock(tr, plan, clock, records))
    tr.train()
    measured = records[len(PATHS) :]  # after the warm-up steps
    out: dict[str, Any] = {
        "env": env,
        "model": a.model if not a.quick else "tiny",
        "P": prompts,
        "G": group,
        "max_completion_length": budget,
        "steps_per_path": a.steps,
        "records": records,
    }
    for path in PATHS:
        rows = [r for r in measured if r["path"] == path]
        cpu = sum(r["cpu_s"] for r in rows)
        episodes = sum(r["episodes"] for r in rows)
        out[path] = {
            "episodes_per_cpu_s": episodes / cpu,
            "cpu_s_per_step": cpu / len(rows),
            "wall_s_per_step": statistics.median(r["wall_s"] for r in rows),
            **{f"{p}_s": sum(r[f"{p}_s"] for r in rows) / len(rows) for p in (*PHASES, "rest")},
            "sampled_tokens_per_episode": sum(r["sampled_tokens"] for r in rows) / episodes,
            "turns_per_episode": sum(r["turns"] for r in rows) / episodes,
        }
    out["ratio"] = out["ours"]["episodes_per_cpu_s"] / out["plain"]["episodes_per_cpu_s"]
    out["over_probe"] = out["ours"]["episodes_per_cpu_s"] / PROBE_RATE
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="organism-m", help="model alias or folder (default organism-m: m128)")
    p.add_argument("--envs", default="FrozenLake,Bandit")
    p.add_argument(
        "--steps", type=int, default=3, help="measured steps per path, after one warm-up step each"
    )
    p.add_argument(
        "--budget",
        type=int,
        default=1024,
        help="FrozenLake's max_completion_length: room for all three turns (Bandit: the profile's)",
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny random model, 2 x 4 episodes, one step each: seconds"
    )
    p.add_argument("--json", default=None, help="write the results (JSON) to this file")
    a = p.parse_args(argv)
    a.model_dir = None
    if a.quick:
        from tests._tiny import build_tiny_model

        a.model_dir = build_tiny_model(tempfile.mkdtemp(prefix="bench_organism_tiny_"))
        a.steps, a.budget = 1, 320
    results = [bench(env, a) for env in a.envs.split(",")]
    cols = ("generation", "loss_forward", "backward", "optimizer", "rest")
    print(
        f"{'env':<11}{'path':<6}{'episodes/CPU-s':>15}{'CPU-s/step':>11}{'wall s':>8}  "
        + "".join(f"{c.replace('_', ' '):>13}" for c in cols)
        + f"{'tokens/ep':>10}{'turns/ep':>9}"
    )
    for r in results:
        for path in PATHS:
            x = r[path]
            print(
                f"{r['env']:<11}{path:<6}{x['episodes_per_cpu_s']:>15.1f}{x['cpu_s_per_step']:>11.2f}"
                f"{x['wall_s_per_step']:>8.1f}  "
                + "".join(f"{x[c + '_s']:>13.2f}" for c in cols)
                + f"{x['sampled_tokens_per_episode']:>10.1f}{x['turns_per_episode']:>9.2f}",
                flush=True,
            )
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results}, indent=1))
    parts = []
    for r in results:
        probe = f", {r['over_probe']:.2f}x the probe's {PROBE_RATE:g}" if r["env"] == "FrozenLake" else ""
        parts.append(
            f"{r['env']} {r['ours']['episodes_per_cpu_s']:.1f} episodes/CPU-s ({r['ratio']:.2f}x plain{probe})"
        )
    print(f"organism speed ({results[0]['model']}): " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
