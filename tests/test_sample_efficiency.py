"""Sample efficiency: ``llmgym-sft`` on the model organism learns FrozenLake from a few hundred solver episodes as
well as a plain-PyTorch control trained from scratch on the same episodes (``benchmarks/plain_control.py``).

Both train on the same 281 solver episodes (about 520 moves) of 3x3 CoordFrozenLake and play the same held-out
seeds greedily. The test holds our SFT's interval to overlap the control's (they do not differ at this
sample size), and its broken twin, the pipeline as it was (TRL's loss on every reply token, 300 steps: 0.36
against the control's ~0.8), must not. The organism's FrozenLake recipe (``docs/training/organism.md``):
format tokens weighed 0.1, 600 steps (its accuracy on the move stays at the marginal for ~250 steps before
it reads the board). About 15 CPU-minutes in all.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from llm_gym.agent.export import export_episodes, write_jsonl  # noqa: E402
from llm_gym.trainer import evaluate, sft  # noqa: E402

pytestmark = pytest.mark.slow
BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ORGANISM = _bench("organism_learning")
SEEDS = range(ORGANISM.FL_EVAL_SEED, ORGANISM.FL_EVAL_SEED + 512)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The benchmark's solver episodes: seeds 1,000,000.. (300 tried, those the solver finishes in 3 moves)."""
    rows = export_episodes(
        ORGANISM.FL_ENV, range(1_000_000, 1_000_300), env_kwargs=ORGANISM.FL_KWARGS, expert_fraction=1.0
    ).rows
    path = tmp_path_factory.mktemp("fl") / "solver.jsonl"
    write_jsonl(rows, path)
    return path


@pytest.fixture(scope="module")
def control(data) -> dict:
    return _bench("plain_control").run(data, ORGANISM.FL_ENV, ORGANISM.FL_KWARGS, SEEDS)


def _sft(data: Path, out: Path, weight: float, steps: int) -> dict:
    argv = ["--model", "organism-s", "--data", str(data), "--output_dir", str(out / "sft"), "--max_steps"]
    argv += [str(steps), "--per_device_train_batch_size", "32", "--learning_rate", "1e-3", "--lr_scheduler_type"]
    argv += ["constant", "--seed", "0", "--format_loss_weight", str(weight), "--report_to", "none"]
    assert sft.main([*argv, "--save_strategy", "no", "--logging_steps", "100"]) == 0
    argv = ["--model", str(out / "sft" / "final"), "--env", ORGANISM.FL_ENV, "--env_kwargs"]
    argv += [json.dumps(ORGANISM.FL_KWARGS), "--eval_seed", str(SEEDS[0]), "--num_eval_seeds", str(len(SEEDS))]
    argv += ["--temperature", "0", "--max_new_tokens", "16", "--output_dir", str(out / "eval"), "--no_progress"]
    assert evaluate.main(argv) == 0
    summary = json.loads((out / "eval" / "summary.json").read_text())["envs"][ORGANISM.FL_ENV]
    return {"rate": summary["success_rate"], "ci": summary["success_ci"]}


@pytest.mark.parametrize(
    "weight, steps, reaches",
    [(0.1, 600, True), pytest.param(1.0, 300, False, id="broken-twin-trl-loss-300-steps")],
)
def test_our_sft_reaches_the_plain_control_on_the_same_episodes(data, control, tmp_path, weight, steps, reaches):
    ours = _sft(data, tmp_path, weight, steps)
    theirs = control["success"]
    overlap = ours["ci"][1] >= theirs["ci"][0]
    message = f"ours {ours['rate']:.3f} {ours['ci']} vs control {theirs['rate']:.3f} {theirs['ci']}"
    assert theirs["ci"][0] > 0.5, f"the control itself did not learn: {message}"
    assert overlap is reaches, message
