"""The learning curve's series (pure) and its PNG; the episode chosen for the run's GIF."""

from __future__ import annotations

import pytest

from llm_gym.agent.records import EpisodeRecord

pytest.importorskip("matplotlib")

from llm_gym.trainer import learning_curve  # noqa: E402

REPORT = {
    "baseline": {"random": {"ci": [0.42, 0.51]}},
    "evals": [
        {"step": 0, "success": {"rate": 0.47, "ci": [0.42, 0.51]}},
        {"step": 40, "success": {"rate": 0.65, "ci": [0.60, 0.69]}},
        {"step": "x", "success": {"rate": 0.1, "ci": [0, 1]}},  # not a step: left out
    ],
}


def test_curve_reads_training_success_evaluations_and_the_baseline():
    history = [{"step": 5, "env/success": 0.4}, {"step": 10, "loss": 1.0}, {"step": 10, "env/success": 0.5}]
    data = learning_curve.curve(history, REPORT)
    assert data["train"] == [(5, 0.4), (10, 0.5)]
    assert data["evals"] == [(0, 0.47, 0.42, 0.51), (40, 0.65, 0.60, 0.69)]
    assert data["random"] == (0.42, 0.51)
    assert learning_curve.curve([], None) == {"train": [], "evals": [], "random": None}


def test_plot_writes_a_png(tmp_path):
    out = learning_curve.plot(
        learning_curve.curve([{"step": 1, "env/success": 0.5}], REPORT), tmp_path / "c.png"
    )
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG" and out.endswith("c.png")


def _record(mode: str, step: int, seed: int) -> EpisodeRecord:
    return EpisodeRecord(
        env_id="llmgym/Bandit-v0", seed=seed, initial_observation="", meta={"mode": mode, "step": step}
    )


def test_the_gif_shows_the_last_evaluations_first_episode():
    records = [_record("eval", 0, 1), _record("train", 7, 2), _record("eval", 40, 3), _record("eval", 40, 4)]
    assert learning_curve.last_eval_episode(records).seed == 3
    assert learning_curve.last_eval_episode([_record("train", 1, 1)]) is None
