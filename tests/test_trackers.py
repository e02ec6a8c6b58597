"""``--report_to tensorboard``: env, SNR and MI scalars and the collapse plot image, read back offline with
TensorBoard's own event reader."""

from __future__ import annotations

import glob
import json
import os
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorboard")

from llm_gym.trainer.trackers import IMAGE_TAG, CollapsePlotCallback, image_trackers, png_to_array  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

G = 2


def read_events(log_dir: str) -> EventAccumulator:
    acc = EventAccumulator(log_dir, size_guidance={"images": 0, "scalars": 0})
    acc.Reload()
    return acc


def test_image_trackers_and_png_to_array(tmp_path):
    assert image_trackers(["tensorboard", "wandb"]) == ["tensorboard"]
    assert image_trackers("trackio") == ["trackio"] and image_trackers([]) == []
    import matplotlib.image
    import numpy as np

    rgba = np.zeros((3, 5, 4), dtype=np.float32)
    rgba[..., 0], rgba[..., 3] = 1.0, 1.0
    matplotlib.image.imsave(tmp_path / "x.png", rgba)
    arr = png_to_array(str(tmp_path / "x.png"))
    assert arr.shape == (3, 5, 3) and arr.dtype == np.uint8 and (arr[..., 0] == 255).all()


def _train_two_steps(tiny_dir, out, report_to, **extra):
    from tests._tiny import make_tiny_trainer, tiny_run_kwargs

    def reward(prompts, completions, **_):  # every group has reward variance: the filter keeps them
        return [float(i % G) for i in range(len(prompts))]

    kwargs = tiny_run_kwargs(
        out,
        report_to=report_to,
        num_generations=G,
        mi_every=1,
        mi_num_samples=4,
        mi_reasoning="turn",
        filter_strategy="top_p",
        **extra,
    )
    tr = make_tiny_trainer(tiny_dir, kwargs, reward_funcs=[reward])
    tr.train()
    return tr


def test_two_step_run_logs_env_snr_mi_scalars_and_the_collapse_image(tiny_dir, tmp_path):
    out = tmp_path / "run"
    _train_two_steps(tiny_dir, out, ["tensorboard"])
    dirs = {os.path.dirname(p) for p in glob.glob(str(out / "**" / "events.out.tfevents.*"), recursive=True)}
    assert len(dirs) == 1, dirs  # one TensorBoard log folder
    acc = read_events(dirs.pop())
    scalars = acc.Tags()["scalars"]
    for prefix in ("train/env/", "train/snr/", "train/mi/"):
        assert any(t.startswith(prefix) for t in scalars), (prefix, scalars)
    assert "train/env/success" in scalars and "train/snr/kept_frac" in scalars
    assert "train/mi/trajectory/mi_est" in scalars
    assert [e.step for e in acc.Scalars("train/snr/kept_frac")] == [1, 2]
    assert IMAGE_TAG in acc.Tags()["images"]
    images = acc.Images(IMAGE_TAG)
    assert images[-1].step == 2  # the last step's plot
    assert images[-1].encoded_image_string.startswith(b"\x89PNG") and images[-1].width > 200
    assert (out / "collapse.png").is_file()


class TensorBoardCallback:  # the name the plot callback looks for; its writer is already closed
    tb_writer = None

    def __init__(self, logging_dir):
        self.logging_dir = logging_dir


def test_train_end_opens_its_own_writer_when_tensorboards_is_closed(tmp_path):
    report = tmp_path / "collapse.jsonl"
    rows = [{"step": 1, "snr/kept_frac": 0.5, "mi/trajectory/mi_est": 0.1}, {"step": 3, "snr/kept_frac": 1.0}]
    report.write_text("".join(json.dumps(r) + "\n" for r in rows))
    log_dir = tmp_path / "tb"
    cb = CollapsePlotCallback(str(report), [TensorBoardCallback(str(log_dir))], ["tensorboard"])
    state = SimpleNamespace(is_world_process_zero=True, global_step=3, max_steps=3)
    cb.on_train_end(SimpleNamespace(output_dir=str(tmp_path)), state, None)
    images = read_events(str(log_dir)).Images(IMAGE_TAG)
    assert [i.step for i in images] == [3]
    cb.on_train_end(SimpleNamespace(output_dir=str(tmp_path)), state, None)  # nothing new: no second image
    assert len(read_events(str(log_dir)).Images(IMAGE_TAG)) == 1


@pytest.mark.slow  # a fresh process (trackio must see TRACKIO_DIR before its first import): about 20 s
def test_trackio_offline_gets_the_metrics_and_the_collapse_image(tiny_dir, tmp_path):
    pytest.importorskip("trackio")
    import subprocess
    import sys

    # trackio fixes its folder (TRACKIO_DIR) when first imported, which importing the trainer already does:
    # run in a fresh process pointed at a temporary folder (offline: nothing is uploaded without a Space id).
    code = (
        "import sys; from tests.test_trackers import _train_two_steps; "
        "_train_two_steps(sys.argv[1], sys.argv[2], ['trackio'], project='llmgym-test', run_name='r1'); "
        "from trackio.sqlite_storage import SQLiteStorage; import json; "
        "print('LOGS=' + json.dumps(SQLiteStorage.get_logs('llmgym-test', 'r1'), default=str))"
    )
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tiny_dir), str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = json.loads(next(line[5:] for line in proc.stdout.splitlines() if line.startswith("LOGS=")))
    keys = {k for row in logs for k in row}
    for prefix in ("train/env/", "train/snr/", "train/mi/"):
        assert any(k.startswith(prefix) for k in keys), (prefix, keys)
    images = [row[IMAGE_TAG] for row in logs if IMAGE_TAG in row]
    assert images and images[-1]["_type"] == "trackio.image"
    media = list((tmp_path / "trackio" / "media").rglob("*.png"))
    assert media and media[0].read_bytes().startswith(b"\x89PNG")
