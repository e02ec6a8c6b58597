"""Collapse report: the JSONL writer callback and the PNG plotter."""

import json
import math
from types import SimpleNamespace

from llm_gym.trainer.callbacks import CollapseReportCallback
from llm_gym.trainer.collapse_report import main, read_series, summary
from PIL import Image


def collapsing_rows(n=12):
    """MI falls to chance while the conditional entropy holds: template collapse."""
    rows = []
    for step in range(1, n + 1):
        z = 2.0 * (1 - step / n)
        rows.append(
            {
                "step": step,
                "mi/trajectory/mi_zscore_ema": z,
                "mi/trajectory/retrieval_acc": 0.1 + 0.8 * (1 - step / n),
                "mi/trajectory/retrieval_chance": 0.1,
                "mi/trajectory/cond_entropy": 2.0,
                "snr/kept_frac": 0.5,
                "snr/skipped": float(step > n - 2),
                "entropy": 1.5,
            }
        )
    return rows


def test_callback_writes_finite_signal_values_and_restarts_fresh(tmp_path):
    path = tmp_path / "run" / "collapse.jsonl"
    cb = CollapseReportCallback(str(path))
    state = SimpleNamespace(is_world_process_zero=True, global_step=3)
    cb.on_log(
        None, state, None, logs={"loss": 1.0, "entropy": 2.0, "snr/kept_frac": 0.5, "mi/x/mi_est": math.nan}
    )
    cb.on_log(None, state, None, logs={"loss": 1.0, "entropy": 2.0})  # no signal keys: no line
    assert [json.loads(line) for line in open(path)] == [{"step": 3, "entropy": 2.0, "snr/kept_frac": 0.5}]
    cb.on_train_begin(None, SimpleNamespace(is_world_process_zero=True, global_step=0), None)
    assert not path.exists()
    other = SimpleNamespace(is_world_process_zero=False, global_step=4)
    cb.on_log(None, other, None, logs={"snr/kept_frac": 0.5})
    assert not path.exists()


def test_plot_is_a_readable_png_and_summary_flags_collapse(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "collapse.jsonl", "w") as f:
        for row in reversed(collapsing_rows()):  # order on disk does not matter
            f.write(json.dumps(row) + "\n")
    assert [r["step"] for r in read_series(run)] == list(range(1, 13))
    assert main([str(run)]) == 0
    with Image.open(run / "collapse.png") as img:
        assert img.size[0] > 600 and img.size[1] > 800
    out = capsys.readouterr().out
    assert "WARNING trajectory" in out and "template collapse" in out
    assert "2 of 12 logged steps skipped" in out


def test_healthy_run_has_no_warning():
    rows = [
        {"step": s, "mi/trajectory/mi_zscore_ema": 1.0 + s, "mi/trajectory/cond_entropy": 2.0}
        for s in range(6)
    ]
    assert not any(line.startswith("WARNING") for line in summary(rows))


def test_bad_report_input_exits_with_an_error(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\nnot json\n')
    assert main([str(bad), "--out", str(tmp_path / "x.png")]) == 2
    assert "not JSON" in capsys.readouterr().err
