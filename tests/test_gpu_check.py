"""``benchmarks/gpu_check.py`` on CPU with the tiny shape: the script's logic (profile reading, round plan,
generation and update loops, exact state bytes next to the estimate, JSON + table); the GPU numbers themselves
need a CUDA box."""

import argparse
import json
import sys
from pathlib import Path

import pytest

from tests._tiny import TINY_QWEN2_SHAPE

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

TINY = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 400,
    **TINY_QWEN2_SHAPE,
    "torch_dtype": "float32",
}


@pytest.fixture(scope="module")
def gpu_check():
    pytest.importorskip("torch")
    import gpu_check

    return gpu_check


def test_plan_follows_the_profile_budget_and_bounds_the_round(gpu_check):
    s = gpu_check.settings_from(gpu_check.load_profile("sokoban"), [])
    assert s["num_prompts"] * s["num_generations"] == gpu_check.plan(s, 300, 10**9)["rows"]
    small = {**s, "num_prompts": 2, "num_generations": 2, "max_new_tokens": 8, "max_turns": 3}
    assert gpu_check.plan({**small, "max_completion_length": 10}, 5, 10**6)["turn_tokens"] == [8]
    p = gpu_check.plan({**small, "max_completion_length": 100, "per_device_train_batch_size": 3}, 5, 10**6)
    assert p["turn_tokens"] == [8, 8, 8] and p["completion_length"] == 8 * 3 + 16 * 2
    assert p["micro_batches"] == 2  # 4 rows in micro-batches of 3
    with pytest.raises(ValueError, match="max_tokens"):
        gpu_check.plan(small | {"max_completion_length": 100}, 5, 10)
    with pytest.raises(ValueError, match="key=value"):
        gpu_check.settings_from({}, ["not_a_setting=3"])
    with pytest.raises(ValueError, match="positive integer"):
        gpu_check.settings_from({}, ["max_turns=0"])


def test_tiny_shape_on_cpu_reports_json_and_table_with_exact_states(gpu_check, tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "report.json"
    sets = [
        "num_prompts=2",
        "num_generations=2",
        "per_device_train_batch_size=2",
        "gradient_accumulation_steps=1",
        "max_new_tokens=4",
        "max_turns=2",
        "max_completion_length=64",
        "bf16=false",
    ]
    argv = [
        "--env",
        "bandit",
        "--model_config",
        str(cfg),
        "--device",
        "cpu",
        "--steps",
        "2",
        "--prompt_length",
        "8",
    ]
    argv += [x for s in sets for x in ("--set", s)] + ["--json", str(out), "--gpu_gib", "80"]
    assert gpu_check.main(argv) == 0
    r = json.loads(out.read_text())
    assert (
        r["plan"]["rows"] == 4 and r["plan"]["turn_tokens"] == [4, 4] and r["plan"]["completion_length"] == 24
    )
    assert len(r["rounds"]) == 2 and all(x["generated_tokens"] == 4 * 8 for x in r["rounds"])
    assert r["generation_tokens_per_s"] > 0 and r["update_seconds_per_round"] > 0
    assert r["plan"]["optimizer_steps"] == 2 and r["optimizer_step_seconds"] > 0
    # weights, gradients and AdamW state measured from the tensors equal the estimator's, byte for byte
    est = r["estimate_bytes"]
    assert r["measured_state_bytes"] == {k: est[k] for k in ("weights", "gradients", "optimizer")}
    assert r["parameters"] == 99_904 and r["measured_state_bytes"]["weights"] == 4 * 99_904
    measured, estimated = r["side_by_side"]["model_states"]
    assert measured == estimated
    assert r["peak_memory_bytes"]["cpu"] > 0 and r["fits"]["estimate_fits"] is True
    # what a GPU run shows first: llmgym-train's loading path keeps float32 weights of a bf16 checkpoint, one step
    # at the profile's lr 1e-6 moves nearly every element, and a base model's turn stops at <|im_end|>
    assert r["loading"]["checkpoint_dtype"] == "bfloat16" and set(r["loading"]["parameter_dtypes"]) == {
        "float32"
    }
    assert r["one_step"]["learning_rate"] == 1e-6 and r["one_step"]["changed_fraction"] > 0.9
    hf = r["stops_at_im_end"]["hf_generate"]
    assert hf["llmgym_stops_at_im_end"] and hf["llmgym_tokens"] == 1
    assert not hf["eos_only_stops_at_im_end"] and hf["eos_only_tokens"] == 16
    text = capsys.readouterr().out
    assert "tokens/s" in text and "measured" in text and "estimate" in text and "model_states" in text
    assert "llmgym-train loading: checkpoint bfloat16 -> parameters {'float32'" in text
    assert "stops at <|im_end|> (hf_generate): llm-gym's stop ids True" in text


def test_ragen2_profile_settings_come_from_the_common_file(gpu_check):
    s = gpu_check.settings_from(gpu_check.load_profile("sokoban", "ragen2"), [])
    assert (s["learning_rate"], s["weight_decay"], s["max_grad_norm"], s["dtype"]) == (
        1e-6,
        0.01,
        1.0,
        "float32",
    )
    assert s["num_prompts"] * s["num_generations"] == 128 and s["per_device_train_batch_size"] == 1


def test_vllm_needs_cuda(gpu_check, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main(["--use_vllm", "--device", "cpu"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_vllm_generation_reports_device_wide_memory_and_releases_the_engine(gpu_check, monkeypatch):
    """vLLM's engine runs in its own process, so the memory reported for it is the device's (``mem_get_info``),
    taken while the engine is alive, and the engine is released before the stop check builds another one. A
    stand-in ``vllm`` module runs the loop on CPU."""
    import types
    import weakref

    import torch

    engines = []

    class LLM:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            engines.append(weakref.ref(self))

        def generate(self, prompts, sp, use_tqdm=False):
            out = types.SimpleNamespace(token_ids=[7] * sp.max_tokens)
            return [types.SimpleNamespace(outputs=[out]) for _ in prompts]

    class SamplingParams:
        def __init__(self, max_tokens, **kwargs):
            self.max_tokens = max_tokens

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (30, 100), raising=False)
    p = {
        "rows": 3,
        "prompt_length": 4,
        "turn_tokens": [2, 2],
        "observation_tokens": 1,
        "completion_length": 5,
    }
    rows, tokens, seconds, used = gpu_check.generate_vllm("unused", p, 50, 0.3, "bfloat16")
    assert tokens == 3 * 4 and seconds >= 0 and used == 70
    assert [len(r) for r in rows] == [4 + 2 + 1 + 2] * 3
    assert engines[0]() is None  # released before returning


def test_the_estimate_counts_the_models_the_check_does_not_run(gpu_check):
    """``fits`` speaks for the real run: the ragen2 profile's PPO with a separate critic needs the critic's
    float32 states too (46.9 GiB for Qwen2.5-3B), although the check itself times the policy only."""
    from llm_gym.trainer.memory import GIB, estimate_memory
    from llm_gym.trainer.precision import decide_precision

    config = json.loads(gpu_check.DEFAULT_CONFIG.read_text())
    s = gpu_check.settings_from(gpu_check.load_profile("sokoban", "ragen2"), [])
    precision = decide_precision(argparse.Namespace(dtype=s["dtype"], bf16=s["bf16"]), gpu=True)
    p = gpu_check.plan(s, 512, 10**9)
    setup = gpu_check.estimate_setup(s, p, precision)
    assert (s["algo"], s["critic_model"]) == ("ppo", "separate") and setup.critic and setup.value_head
    est = estimate_memory(config, setup)
    assert est.components["critic"] / GIB > 40 and not setup.reference_model
    grpo = gpu_check.estimate_setup(
        gpu_check.settings_from(gpu_check.load_profile("sokoban"), []), p, precision
    )
    assert not grpo.critic and not grpo.value_head
    kl = gpu_check.estimate_setup({**s, "algo": "grpo", "beta": 0.04}, p, precision)
    assert kl.reference_model and not kl.critic
    with pytest.raises(ValueError, match="algo"):
        gpu_check.settings_from({}, ["algo=reinforce"])
