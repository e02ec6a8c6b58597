"""Scale-out on CPU processes (gloo): FSDP2 with the shipped config, two accelerate "machines", DeepSpeed ZeRO-2.

Each test launches ``tests/_scaleout_worker.py`` with ``accelerate launch`` and the shipped config from
``trainer/accelerate_configs/``, overridden on the command line only where CPU processes need it
(``--num_processes``, ``--mixed_precision no``; see ``docs/scale-out.md``). The worker trains the tiny model
with a scripted reward, so filtered and skipped rounds happen on known steps, and writes per-rank digests of
its parameter shards and optimizer state before and after every optimizer step.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "trainer" / "accelerate_configs"
WORKER = Path(__file__).resolve().with_name("_scaleout_worker.py")
ACCELERATE = Path(sys.executable).with_name("accelerate")
G = 4  # rollouts per group; 2 groups per round (seeds 10000 + 2 * round + group)


def _env() -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    config: str, worker_args: list[str], *launch_args: str, timeout: int = 300
) -> subprocess.CompletedProcess:
    cmd = [
        str(ACCELERATE),
        "launch",
        "--config_file",
        str(CONFIGS / config),
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(_free_port()),
        *launch_args,
        str(WORKER),
        *worker_args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def _probes(d: Path, world: int) -> list[dict]:
    return [json.loads((d / f"probe-rank{r}.json").read_text()) for r in range(world)]


def _train_logs(probe: dict) -> dict[int, dict]:
    return {h["step"]: h for h in probe["log_history"] if "loss" in h}


def _records(path: Path) -> list[dict]:
    from llm_gym.agent.records import read_records

    return [r.to_dict() for r in read_records(path)]


@pytest.mark.slow
def test_fsdp_on_two_cpu_processes_keeps_lockstep_skips_exactly_and_resumes(tiny_dir, tmp_path):
    # rounds: group 1 kept (filtered) | nothing kept (skipped) | both kept | nothing kept (skipped)
    common = ["--model", str(tiny_dir), "--schedule", "1|-|0,1|-", "--max_steps", "4", "--save_steps", "2"]
    a = _launch(
        "fsdp.yaml",
        [*common, "--output_dir", str(tmp_path / "a"), "--probe_dir", str(tmp_path / "pa"), "--fsdp_on_cpu"],
        "--num_processes",
        "2",
    )
    assert a.returncode == 0, a.stderr[-4000:]
    runs = _probes(tmp_path / "pa", 2)
    for p in runs:
        # really sharded: every parameter is a DTensor and each rank holds half of the 99,904 weights
        assert p["world_size"] == 2 and p["distributed_type"] == "DistributedType.FSDP"
        assert p["dtensor_params"] == p["num_params"] > 0
        assert [s["step"] for s in p["steps"]] == [1, 2, 3, 4]
        assert [s["skipped"] for s in p["steps"]] == [0, 1, 0, 1]
        for s in p["steps"]:
            # lockstep: at every step end all ranks report the same step, skip, round and empty-streak counters
            assert (
                s["all_ranks"][0] == s["all_ranks"][1] == [s["step"], s["skipped"], s["step"], s["skipped"]]
            )
            unchanged = s["before"] == s["after"]
            assert unchanged == bool(s["skipped"]), s  # skipped: shards and AdamW state bitwise equal
    assert (
        sum(p["local_numel"] for p in runs) == 99_904
        and runs[0]["steps"][0]["before"] != runs[1]["steps"][0]["before"]
    )
    logs = _train_logs(runs[0])
    assert [logs[s]["snr/kept_groups"] for s in (1, 2, 3, 4)] == [1, 0, 2, 0]
    assert [logs[s]["snr/skipped"] for s in (1, 2, 3, 4)] == [0, 1, 0, 1]
    assert logs[1]["snr/update_rows"] == 8 and logs[1]["snr/padding_rows"] == 4  # rank 0 trains 4 dummy rows
    # records of both ranks, gathered and written once: every seed of every round exactly G times
    seen = Counter(
        (r["meta"]["mode"], r["meta"]["step"], r["seed"]) for r in _records(tmp_path / "a" / "episodes.jsonl")
    )
    assert seen == {("train", rnd, 10_000 + 2 * rnd + g): G for rnd in range(4) for g in range(2)}
    ckpt = tmp_path / "a" / "checkpoint-2"
    assert (ckpt / "pytorch_model_fsdp_0").is_dir() and (ckpt / "optimizer_0").is_dir()  # sharded state dict

    b = _launch(
        "fsdp.yaml",
        [
            *common,
            "--output_dir",
            str(tmp_path / "b"),
            "--probe_dir",
            str(tmp_path / "pb"),
            "--fsdp_on_cpu",
            "--resume_from_checkpoint",
            str(ckpt),
        ],
        "--num_processes",
        "2",
    )
    assert b.returncode == 0, b.stderr[-4000:]
    for pa, pb in zip(runs, _probes(tmp_path / "pb", 2)):
        assert [s["step"] for s in pb["steps"]] == [3, 4]
        # the shards and optimizer state loaded from the checkpoint are the ones saved after step 2 ...
        assert pb["steps"][0]["before"] == pa["steps"][1]["after"]
        # ... and the resumed run continues bitwise like the uninterrupted one (RNG states restored too)
        assert [s["after"] for s in pb["steps"]] == [s["after"] for s in pa["steps"][2:]]
    seen_b = Counter((r["meta"]["step"], r["seed"]) for r in _records(tmp_path / "b" / "episodes.jsonl"))
    assert seen_b == {(rnd, 10_000 + 2 * rnd + g): G for rnd in (2, 3) for g in range(2)}


@pytest.mark.slow
def test_two_accelerate_machines_match_a_one_process_run(tiny_dir, tmp_path):
    """``num_machines=2`` (one process each, rendezvous on 127.0.0.1) against one process with the same seeds
    and global batch; rows are sampled with per-row seeds, so both runs see the same trajectories."""
    common = ["--model", str(tiny_dir), "--schedule", "1|0,1", "--max_steps", "2", "--per_row_sampling"]
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        cmd = [
            str(ACCELERATE),
            "launch",
            "--config_file",
            str(CONFIGS / "ddp.yaml"),
            "--mixed_precision",
            "no",
            "--num_machines",
            "2",
            "--num_processes",
            "2",
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            port,
            str(WORKER),
            *common,
            "--output_dir",
            str(tmp_path / "two"),  # shared by both "machines", like a cluster file system
            "--probe_dir",
            str(tmp_path / "p2"),
            "--per_device_train_batch_size",
            str(G),
        ]
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        )
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    one = subprocess.run(
        [
            sys.executable,
            str(WORKER),
            *common,
            "--output_dir",
            str(tmp_path / "one"),
            "--probe_dir",
            str(tmp_path / "p1"),
            "--per_device_train_batch_size",
            str(2 * G),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert one.returncode == 0, one.stderr[-4000:]

    two = _probes(tmp_path / "p2", 2)
    (single,) = _probes(tmp_path / "p1", 1)
    assert [p["world_size"] for p in two] == [2, 2] and [p["rank"] for p in two] == [0, 1]
    assert two[0]["distributed_type"] == "DistributedType.MULTI_CPU" and single["world_size"] == 1
    assert two[1]["log_history"] == []  # only the global main process keeps the log
    logs2, logs1 = _train_logs(two[0]), _train_logs(single)
    assert sorted(logs2) == sorted(logs1) == [1, 2]
    for step in (1, 2):
        a, b = logs2[step], logs1[step]
        for key in ("snr/kept_groups", "snr/kept_frac", "snr/skipped", "reward", "reward_std", "num_tokens"):
            assert a[key] == b[key], (step, key)
        assert a["completions/mean_length"] == b["completions/mean_length"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-5)
    assert [logs1[s]["snr/kept_groups"] for s in (1, 2)] == [1, 2]
    assert logs2[1]["loss"] == pytest.approx(logs1[1]["loss"], abs=1e-6)
    # the same trajectories, each written once (by the main process of machine 0)
    rec2 = sorted(json.dumps(r, sort_keys=True) for r in _records(tmp_path / "two" / "episodes.jsonl"))
    rec1 = sorted(json.dumps(r, sort_keys=True) for r in _records(tmp_path / "one" / "episodes.jsonl"))
    assert len(rec2) == 2 * 2 * G and rec2 == rec1


@pytest.mark.slow
def test_deepspeed_zero2_on_cpu_refuses_the_snr_filter_and_trains_without_it(tiny_dir, tmp_path):
    """Needs ``deepspeed`` importable (not a project dependency; see docs/scale-out.md). DeepSpeed's CPU
    accelerator runs ZeRO-2 over gloo; accelerate only sets up its processes with ``ddp_backend=gloo`` and
    ``use_cpu=False``."""
    pytest.importorskip("deepspeed")
    common = ["--model", str(tiny_dir), "--max_steps", "2", "--no_use_cpu", "--ddp_backend", "gloo"]
    refused = _launch(
        "deepspeed_zero2.yaml",
        [*common, "--output_dir", str(tmp_path / "f"), "--probe_dir", str(tmp_path / "pf")],
        "--num_processes",
        "2",
    )
    assert refused.returncode != 0 and "refused under DeepSpeed" in refused.stderr
    assert "FSDP" in refused.stderr and "--filter_strategy off" in refused.stderr
    ok = _launch(
        "deepspeed_zero2.yaml",
        [
            *common,
            "--filter_strategy",
            "off",
            "--output_dir",
            str(tmp_path / "o"),
            "--probe_dir",
            str(tmp_path / "po"),
        ],
        "--num_processes",
        "2",
    )
    assert ok.returncode == 0, ok.stderr[-4000:]
    probes = _probes(tmp_path / "po", 2)
    assert all(p["distributed_type"] == "DistributedType.DEEPSPEED" and p["world_size"] == 2 for p in probes)
    assert all(s["before"]["params"] != s["after"]["params"] for p in probes for s in p["steps"])
    # ZeRO-2 partitions the optimizer state: the two ranks hold different parts
    assert probes[0]["steps"][0]["after"]["optim"] != probes[1]["steps"][0]["after"]["optim"]
