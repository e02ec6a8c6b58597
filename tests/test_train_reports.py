"""llmgym-train on CPU settings: baselines beside the before/after evaluation, MI logged, collapse PNG written."""

import json

import pytest

pytest.importorskip("trl")

from llm_gym.trainer.cli import main  # noqa: E402

from llm_gym.agent.baselines import baseline_success  # noqa: E402
from tests._tiny import build_tiny_model  # noqa: E402


def test_cpu_run_reports_baseline_logs_mi_and_plots_collapse(tmp_path, capsys):
    tiny = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "run"
    argv = ["--env", "FrozenLake", "--model", tiny, "--max_steps", "1", "--output_dir", str(out)]
    assert main([*argv, "--num_eval_seeds", "3", "--report_to", "none", "--disable_tqdm", "True"]) == 0
    text = capsys.readouterr().out
    assert "baseline on the same seeds and limits: random valid" in text
    assert "success among valid" in text and "(random valid" in text  # and in the summary line
    report = json.loads((out / "eval_report.json").read_text())
    # the CPU settings' limits (3 turns, FrozenLake's 2 actions per turn, answer-only) on seeds 123..125
    expected = baseline_success("llmgym/FrozenLake-v0", [123, 124, 125], {"max_turns": 3, "think": False})
    assert report["baseline"] == json.loads(json.dumps(expected))
    assert [e["step"] for e in report["evals"]] == [0, 1] and report["evals"][0]["success"]["n"] == 3
    # answer-only CPU runs have no <think> span: MI must still be logged (on the whole turn)
    rows = [json.loads(line) for line in (out / "collapse.jsonl").read_text().splitlines()]
    assert any(k.startswith("mi/first_turn/") for r in rows for k in r)
    assert any(k.startswith("mi/trajectory/") for r in rows for k in r)
    # success, valid answers and step time beside them: collapse and cost read against learning from one file
    assert all({"env/success", "env/valid_action_rate", "step_time"} <= r.keys() for r in rows)
    assert (out / "collapse.png").read_bytes()[:4] == b"\x89PNG"
    # the learning curve and one episode of the last evaluation, as GIF
    assert (out / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert f"learning curve {out / 'learning_curve.png'}" in text
    if (out / "episode.gif").is_file():  # the render extra is installed
        assert (out / "episode.gif").read_bytes()[:6] in (b"GIF89a", b"GIF87a")
    else:
        assert "no episode GIF" in text
