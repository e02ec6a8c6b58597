"""Learning tests: GRPO through ``llmgym-train`` lifts the model organism's held-out Bandit success above the upper
bound of random play's interval and of its own warm start's, and the same run with a deliberate defect does not.

The warm start is ``--warm_start random``: the answer format without a policy (about half the valid answers pick
the better arm), so whatever lies above chance was learned by RL. Each broken twin keeps every setting and breaks
one thing a real bug could break; a learning test that passes on a twin is one that cannot fail.

About 4 CPU-minutes on one core: the warm start (400 SFT steps) once, then 40 RL steps per case, evaluated on 512
held-out seeds each time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from llm_gym.trainer import cli  # noqa: E402

from tests._twins import TWINS, verdict  # noqa: E402

pytestmark = pytest.mark.slow

#: The recipe under test is the ``organism`` profile (trainer/profiles/organism/bandit.yaml: the organism, the
#: random warm start, GRPO at 16 x 8 for 40 steps, 512 evaluation seeds). Only what the test does not look at is
#: switched off here: MI probes, the collapse report and episode records.
RUN = ["--profile", "organism", "--env", "Bandit", "--seed", "42", "--mi_every", "0", "--collapse_report", ""]
RUN += ["--records_every", "1000000"]


def _train(out: Path, *flags: str) -> dict:
    assert cli.main([*RUN, *flags, "--output_dir", str(out), "--overwrite_output_dir"]) == 0
    return json.loads((out / "eval_report.json").read_text())


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> tuple[dict, Path]:
    """The real pipeline, warm start included; the twins start RL from its warm-start model."""
    out = tmp_path_factory.mktemp("bandit") / "real"
    report = _train(out)
    return report, out / "warm_start" / "final"


def test_rl_lifts_held_out_bandit_above_random_and_the_warm_start(real_run):
    report, _ = real_run
    learned, numbers = verdict(report)
    assert learned, numbers
    assert report["warm_start"]["base"]["valid"]["rate"] == 0.0  # the organism starts from nothing


@pytest.mark.parametrize("defect", sorted(TWINS))
def test_a_broken_twin_does_not_learn(real_run, defect, tmp_path, monkeypatch):
    _, warm_start = real_run
    TWINS[defect](monkeypatch)
    report = _train(tmp_path / defect, "--model", str(warm_start), "--warm_start", "none")
    learned, numbers = verdict(report)
    assert not learned, f"{defect} learned: {numbers}"
