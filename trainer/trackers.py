"""The collapse plot in the experiment tracker (``--report_to tensorboard`` or ``trackio``).

The ``env/*``, ``snr/*`` and ``mi/*`` metrics reach every tracker through TRL's logs (TensorBoard shows them as
``train/env/success``, ``train/snr/kept_frac``, ``train/mi/trajectory/mi_zscore_ema``, ...). The collapse plot
(:func:`llm_gym.trainer.collapse_report.plot`: MI, retrieval, entropies, reward variance) is an image, which
transformers' tracker callbacks do not log: :class:`CollapsePlotCallback` draws it from the collapse series
and logs it under the tag ``collapse_report``:

- on a log step that computed MI (at most once per ``min_interval_s`` seconds: drawing takes a fraction of a
  second) and on the last step, through the tracker's open writer (TensorBoard) or run (trackio);
- at the end of training, if the last plot is older than the last logged step: TensorBoard's callback has closed
  its writer by then, so a writer of our own appends to the same log folder (trackio's run is finished by then:
  it gets the images of the log steps only).

Trackio runs offline: it writes to a local SQLite database (``$TRACKIO_DIR``, default
``~/.cache/huggingface/trackio``) and uploads nothing unless a ``trackio_space_id`` is set.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

#: Tag (TensorBoard) / key (trackio) of the collapse plot.
IMAGE_TAG = "collapse_report"
#: Trackers that get the image.
IMAGE_TRACKERS = ("tensorboard", "trackio")


def image_trackers(report_to: Any) -> list[str]:
    """The trackers among ``report_to`` (TrainingArguments' list) that :class:`CollapsePlotCallback` serves."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    return [n for n in IMAGE_TRACKERS if n in names]


def png_to_array(path: str) -> Any:
    """An (H, W, 3) uint8 array of a PNG (for ``SummaryWriter.add_image(..., dataformats="HWC")``)."""
    import matplotlib.image
    import numpy as np

    img = matplotlib.image.imread(path)  # float in [0, 1] for PNG, RGB or RGBA
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    img = img[..., :3]
    if img.dtype != np.uint8:
        img = (np.clip(img, 0.0, 1.0) * 255).round().astype(np.uint8)
    return img


class CollapsePlotCallback(TrainerCallback):
    """Logs the collapse plot as an image to TensorBoard and trackio (see the module docstring).

    Args:
        report_path: the collapse series JSONL (written by ``CollapseReportCallback``, which runs before this).
        callbacks: the trainer's callback list (``trainer.callback_handler.callbacks``), to find the trackers'
            callbacks and their open writers.
        trackers: which of :data:`IMAGE_TRACKERS` to serve.
        min_interval_s: at most one plot per this many seconds during training (the last step always gets one).
    """

    def __init__(
        self, report_path: str, callbacks: list, trackers: list[str], *, min_interval_s: float = 60.0
    ) -> None:
        self.report_path = report_path
        self.callbacks = callbacks
        self.trackers = list(trackers)
        self.min_interval_s = float(min_interval_s)
        self._last_time = -math.inf
        self._last_step: int | None = None
        self._rows_seen = 0

    # ------------------------------------------------------------------------------------------ events
    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        last = bool(control.should_training_stop) or state.global_step >= state.max_steps > 0
        has_mi = any(k.startswith("mi/") for k in logs)
        due = time.monotonic() - self._last_time >= self.min_interval_s
        if last or (has_mi and due):
            self._publish(args, state, closing=False)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero and self._last_step != state.global_step:
            self._publish(args, state, closing=True)

    # ------------------------------------------------------------------------------------------ helpers
    def _publish(self, args: Any, state: Any, *, closing: bool) -> None:
        from llm_gym.trainer.collapse_report import plot, read_series

        if not os.path.isfile(self.report_path):
            return
        try:
            rows = read_series(self.report_path)
        except (OSError, ValueError) as e:  # a tracker image is a convenience: never stop training for it
            logger.warning("collapse plot for the tracker skipped: %s", e)
            return
        if not rows or len(rows) == self._rows_seen:  # nothing new since the last plot (e.g. an eval log)
            return
        png = os.path.splitext(self.report_path)[0] + ".png"
        plot(rows, png, f"collapse report: {os.path.basename(os.path.normpath(args.output_dir))}")
        step = int(state.global_step)
        for tracker in self.trackers:
            try:
                if tracker == "tensorboard":
                    self._to_tensorboard(png, step, args)
                elif tracker == "trackio" and not closing:  # trackio's callback has finished its run by then
                    self._to_trackio(png, step)
            except Exception as e:  # noqa: BLE001 - a tracker failing must not stop training
                logger.warning("could not log the collapse plot to %s: %s", tracker, e)
        self._last_time, self._last_step, self._rows_seen = time.monotonic(), step, len(rows)

    def _find(self, class_name: str) -> Any:
        return next((cb for cb in self.callbacks if type(cb).__name__ == class_name), None)

    def _to_tensorboard(self, png: str, step: int, args: Any) -> None:
        tb = self._find("TensorBoardCallback")
        writer = getattr(tb, "tb_writer", None) if tb is not None else None
        if writer is not None:
            writer.add_image(IMAGE_TAG, png_to_array(png), step, dataformats="HWC")
            writer.flush()
            return
        log_dir = getattr(tb, "logging_dir", None) if tb is not None else None
        if not log_dir:  # TensorBoard never started (e.g. no log step ran)
            return
        from torch.utils.tensorboard import SummaryWriter

        own = SummaryWriter(log_dir=log_dir)  # a second event file in the same folder; TensorBoard reads both
        try:
            own.add_image(IMAGE_TAG, png_to_array(png), step, dataformats="HWC")
        finally:
            own.close()

    def _to_trackio(self, png: str, step: int) -> None:
        import trackio

        trackio.log({IMAGE_TAG: trackio.Image(png)}, step=step)


__all__ = ["IMAGE_TAG", "IMAGE_TRACKERS", "CollapsePlotCallback", "image_trackers", "png_to_array"]
