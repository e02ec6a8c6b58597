"""``llm_gym.trainer.memory``: exact model-state bytes against tensors measured on CPU, Qwen2.5-3B parameter
counts against a hand count and transformers' own module (meta device, no weights), and the estimator's rules."""

import json
from pathlib import Path

import pytest
from llm_gym.trainer.memory import (
    GIB,
    ModelShape,
    TrainingSetup,
    dtype_bytes,
    estimate_memory,
    fits,
    format_table,
    model_state_bytes,
)

from tests._tiny import TINY_QWEN2_SHAPE

QWEN_3B = json.loads(
    (
        Path(__file__).parents[1] / "trainer" / "model_configs" / "Qwen" / "Qwen2.5-3B" / "config.json"
    ).read_text()
)
TINY = {"model_type": "qwen2", "vocab_size": 400, **TINY_QWEN2_SHAPE}


def _measured_states(config: dict, dtype):
    """Bytes of the parameters, gradients and AdamW state of a real random-initialised model after one step."""
    torch = pytest.importorskip("torch")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**config)).to(dtype)
    ids = torch.randint(0, config["vocab_size"], (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()
    params = list(model.parameters())  # tied embeddings appear once
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "weights": nbytes(params),
        "gradients": nbytes(p.grad for p in params),
        "optimizer": nbytes(state),
        "tensors": len(params),
    }


@pytest.mark.parametrize(
    ("dtype_name", "state_dtype", "bias", "tie"),
    [
        ("float32", "float32", True, True),
        ("bfloat16", "bfloat16", True, True),
        ("float32", "float32", None, False),
    ],
)
def test_model_states_match_measured_tensors_exactly(dtype_name, state_dtype, bias, tie):
    torch = pytest.importorskip("torch")
    config = {**TINY, "tie_word_embeddings": tie}
    measured = _measured_states(config, getattr(torch, dtype_name))
    shape = ModelShape.from_config(config)
    assert shape.parameter_tensors() == measured["tensors"]
    # torch's AdamW keeps its moments in the parameter dtype (fp32 states need fp32 or master weights)
    est = model_state_bytes(shape, TrainingSetup(weight_dtype=dtype_name, optimizer_state_dtype=state_dtype))
    assert est == {k: measured[k] for k in ("weights", "gradients", "optimizer")}


def test_qwen25_3b_parameter_count_by_hand_and_by_transformers():
    shape = ModelShape.from_config(QWEN_3B)
    h, inter, layers, vocab, kv = 2048, 11008, 36, 151936, 2 * 128
    attn = h * h + h + 2 * (h * kv + kv) + h * h  # q with bias, k and v with bias, o without
    hand = layers * (attn + 3 * h * inter + 2 * h) + h + vocab * h  # + final norm + tied embedding
    assert shape.parameters() == hand == 3_085_938_688
    assert round(shape.parameters() / 1e9, 2) == 3.09  # Qwen2.5 report: 3.09B
    assert round(shape.non_embedding_parameters() / 1e9, 2) == 2.77  # and 2.77B without embeddings
    torch = pytest.importorskip("torch")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):  # shapes only, no memory
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN_3B))
    assert sum(p.numel() for p in model.parameters()) == shape.parameters()
    assert len(list(model.parameters())) == shape.parameter_tensors()


def test_qwen25_3b_bf16_states_and_sharding_divide_as_configured():
    n = 3_085_938_688
    ddp = estimate_memory(QWEN_3B, TrainingSetup(weight_dtype="bfloat16", master_weights=True))
    assert ddp.components["weights"] == ddp.components["gradients"] == 2 * n
    assert ddp.components["optimizer"] == (8 + 4) * n + 4 * 434  # fp32 moments + fp32 master + step scalars
    z2 = estimate_memory(QWEN_3B, TrainingSetup(master_weights=True, sharding="zero2", num_devices=8))
    assert z2.components["weights"] == 2 * n and z2.components["gradients"] == -(-2 * n // 8)
    assert z2.components["optimizer"] == -(-ddp.components["optimizer"] // 8)
    fsdp = estimate_memory(QWEN_3B, TrainingSetup(master_weights=True, sharding="fsdp", num_devices=8))
    assert fsdp.components["weights"] == -(-2 * n // 8) and fsdp.components["gathered_layer"] > 0
    assert fsdp.total < z2.total < ddp.total


def test_activations_logits_cache_and_extras_follow_the_settings():
    base = TrainingSetup(per_device_batch=4, prompt_length=256, completion_length=256)
    e = estimate_memory(QWEN_3B, base)
    double = estimate_memory(
        QWEN_3B, TrainingSetup(per_device_batch=8, prompt_length=256, completion_length=256)
    )
    for key in ("activations", "logits", "kv_cache"):
        assert e.components[key] > 0 and double.components[key] == 2 * e.components[key]
    # 16-bit logits + fp32 log-softmax over the 256 completion tokens of 4 rows
    assert e.components["logits"] == 4 * 256 * 151936 * (2 + 4)
    # K and V of 36 layers x 2 KV heads x 128 dims, 512 positions, 4 rows, 2 bytes
    assert e.components["kv_cache"] == 4 * 512 * 36 * 2 * 256 * 2
    no_ckpt = estimate_memory(
        QWEN_3B,
        TrainingSetup(
            per_device_batch=4, prompt_length=256, completion_length=256, gradient_checkpointing=False
        ),
    )
    assert no_ckpt.components["activations"] > 5 * e.components["activations"]
    critic = estimate_memory(QWEN_3B, TrainingSetup(per_device_batch=4, critic=True, reference_model=True))
    assert critic.components["critic"] > sum(
        critic.components[k] for k in ("weights", "gradients", "optimizer")
    )
    assert critic.components["reference"] == critic.components["weights"]
    vllm = estimate_memory(
        QWEN_3B, TrainingSetup(use_vllm=True, vllm_gpu_memory_utilization=0.25), gpu_gib=80
    )
    assert vllm.components["vllm"] == 20 * GIB and vllm.components["kv_cache"] == 0
    with pytest.raises(ValueError, match="gpu_gib"):
        estimate_memory(QWEN_3B, TrainingSetup(use_vllm=True))


def test_fits_keeps_headroom_and_the_table_names_every_component():
    assert fits(int(72 * GIB), 80) and not fits(int(72 * GIB) + 1, 80)
    assert fits(80 * GIB, 80, headroom=0.0) and not fits(80 * GIB + 1, 80, headroom=0.0)
    with pytest.raises(ValueError):
        fits(1, 0)
    e = estimate_memory(QWEN_3B, TrainingSetup())
    table = format_table(e, {"weights": 5.75})
    assert all(key in table for key in (*e.components, "total")) and "5.750" in table


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="lacks"):
        ModelShape.from_config({"hidden_size": 8})
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes("int3")
    with pytest.raises(ValueError, match="sharding"):
        TrainingSetup(sharding="zero4")
    with pytest.raises(ValueError):
        TrainingSetup(per_device_batch=0)


def test_precision_decides_the_bytes_fp32_master_weights_cost_16_per_parameter():
    from types import SimpleNamespace

    from llm_gym.trainer.memory import precision_setup
    from llm_gym.trainer.precision import decide_precision

    def setup(backend, dtype="float32", **kw):
        cfg = SimpleNamespace(dtype=dtype, bf16=True, fp16=False, use_cpu=False, use_peft=False)
        return TrainingSetup(**precision_setup(decide_precision(cfg, gpu=True, backend=backend)), **kw)

    n = 3_085_938_688
    default = estimate_memory(QWEN_3B, setup("none"))
    c = default.components
    assert (c["weights"], c["gradients"], c["optimizer"]) == (4 * n, 4 * n, 8 * n + 4 * 434)
    # bf16 autocast: activations, logits and the KV cache in bfloat16, not float32
    assert (
        c["kv_cache"]
        == estimate_memory(QWEN_3B, TrainingSetup(weight_dtype="bfloat16")).components["kv_cache"]
    )
    # the opt-in: bf16 weights, gradients and (torch AdamW) bf16 moments, 8 bytes per parameter
    optin = estimate_memory(QWEN_3B, setup("none", dtype="bfloat16")).components
    assert (optin["weights"], optin["optimizer"]) == (2 * n, 4 * n + 4 * 434)
    # DeepSpeed: bf16 module, fp32 master + moments in the optimizer
    ds = estimate_memory(QWEN_3B, setup("deepspeed")).components
    assert (ds["weights"], ds["optimizer"]) == (2 * n, 12 * n + 4 * 434)
    # FSDP x8: float32 shards, the gathered layer in bf16
    fsdp = estimate_memory(QWEN_3B, setup("fsdp", sharding="fsdp", num_devices=8)).components
    assert fsdp["weights"] == -(-4 * n // 8)
    assert fsdp["gathered_layer"] == 2 * ModelShape.from_config(QWEN_3B).layer_parameters() * 2


def test_separate_critic_counts_the_backbone_without_an_untied_lm_head():
    untied = {**QWEN_3B, "tie_word_embeddings": False}
    shape = ModelShape.from_config(untied)
    e = estimate_memory(untied, TrainingSetup(weight_dtype="float32", critic=True)).components
    backbone = shape.parameters() - shape.vocab_size * shape.hidden_size
    tensors = shape.parameter_tensors() - 1  # no lm_head
    assert e["critic"] == 16 * backbone + 4 * tensors + e["activations"]
    assert e["value_head"] == 16 * (shape.hidden_size + 1) + 8
    assert estimate_memory(untied, TrainingSetup()).components["value_head"] == 0
