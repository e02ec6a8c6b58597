"""Per-device memory estimate of a training run, from a model config and the training settings (pure functions).

No weights are loaded: :class:`ModelShape` reads the few config fields that fix the parameter count of a
Llama / Qwen2-style decoder (``hidden_size``, ``intermediate_size``, layers, heads, KV heads, vocabulary, tied
embeddings, QKV bias), and :func:`estimate_memory` returns the bytes of each component on one device:

- ``weights``, ``gradients`` and ``optimizer`` (AdamW: two moments per parameter in the dtype of the copy it
  updates, a 4-byte ``step`` per parameter tensor as ``torch.optim.AdamW`` keeps it, and an fp32 master copy when
  the weights are 16-bit and ``master_weights`` is set, as DeepSpeed's bf16 mode keeps): exact for unsharded runs
  (tested against tensors measured on CPU), divided over the devices by ZeRO stage / FSDP full sharding.
  :func:`precision_setup` turns a :class:`llm_gym.trainer.precision.Precision` into these fields, so a run is
  counted the way it is loaded: float32 weights + float32 gradients + float32 AdamW moments (16 bytes per
  parameter) with bfloat16 activations under autocast;
- ``activations`` of one micro-batch: the tensors a decoder layer saves for backward (SDPA / flash attention, no
  materialised score matrix), every layer without gradient checkpointing, one layer's input per layer plus one
  full layer with it. An estimate, not a measurement: allocator fragmentation and temporary buffers come on top;
- ``logits`` of one micro-batch over the completion tokens (16-bit logits plus an fp32 log-softmax buffer);
- ``kv_cache`` of HF ``generate`` for the generation batch (0 with vLLM, whose cache lives in its own share);
- ``critic`` (a separate critic: the policy's backbone without an untied LM head, its weights, gradients, optimizer
  state and activations), ``value_head`` (``Linear(hidden, 1)`` in float32 with its AdamW state), ``reference`` (a
  frozen reference model for a KL penalty), ``vllm`` (colocated vLLM's ``gpu_memory_utilization`` share).

:func:`fits` compares a total with a GPU size; :func:`format_plan` prints one setting over 1/2/4/8 GPUs with and
without FSDP (:data:`PLAN_DEVICES`, :data:`PLAN_GPU_GIB`). Used by ``llmgym-train --dry_run``
(:func:`llm_gym.trainer.dry_run.memory_report`) and ``benchmarks/gpu_check.py`` (printed next to measured peaks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

GIB = 1024**3

#: Bytes per element of the dtypes a config or a setting may name.
DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
}

#: What each sharding mode splits over the devices: (weights, gradients, optimizer state).
SHARDING = {
    "none": (False, False, False),  # DDP: every device holds everything
    "zero1": (False, False, True),
    "zero2": (False, True, True),
    "zero3": (True, True, True),
    "fsdp": (True, True, True),  # FSDP FULL_SHARD (the shipped fsdp.yaml)
}


def dtype_bytes(name: str) -> int:
    """Bytes per element of ``name`` (``"bfloat16"``, ``"bf16"``, ``"float32"``, ...)."""
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelShape:
    """The parameter-defining fields of a Llama / Qwen2-style decoder-only model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = True
    attention_bias: bool = True  # Qwen2 has q/k/v biases; Llama does not
    dtype: str = "bfloat16"

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From a ``config.json`` dict (``model_type`` qwen2 / llama / mistral and their kin)."""
        required = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        )
        missing = [k for k in required if k not in config]
        if missing:
            raise ValueError(f"model config lacks {missing}; cannot estimate memory")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        model_type = str(config.get("model_type", "")).lower()
        bias = config.get("attention_bias")
        if bias is None:
            bias = model_type == "qwen2"  # Qwen2's attention always has q/k/v biases (no config field)
        return cls(
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=bool(bias),
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        )

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_parameters(self) -> int:
        h, q, kv, inter = (
            self.hidden_size,
            self.num_attention_heads * self.head_dim,
            self.kv_dim,
            self.intermediate_size,
        )
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.attention_bias else 0)
        mlp = 3 * h * inter  # gate, up, down (SwiGLU), no bias
        return attn + mlp + 2 * h  # two RMSNorm weights

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def parameters(self) -> int:
        """Every parameter: layers, final norm, input embedding (and a separate LM head unless tied)."""
        return (
            self.num_hidden_layers * self.layer_parameters() + self.hidden_size + self.embedding_parameters()
        )

    def non_embedding_parameters(self) -> int:
        return self.parameters() - self.embedding_parameters()

    def parameter_tensors(self) -> int:
        """Number of parameter tensors (AdamW keeps one ``step`` scalar per tensor)."""
        per_layer = (
            4 + 3 + 2 + (3 if self.attention_bias else 0)
        )  # q k v o, gate up down, 2 norms, q/k/v bias
        return self.num_hidden_layers * per_layer + 1 + (1 if self.tie_word_embeddings else 2)


@dataclass(frozen=True)
class TrainingSetup:
    """What a run puts on one device. Lengths are tokens; batches are rows per device."""

    per_device_batch: int = 8  # rows per forward/backward (per_device_train_batch_size)
    prompt_length: int = 512
    completion_length: int = 512
    generation_batch: int | None = None  # rows generated at once per device (default: per_device_batch)
    weight_dtype: str = "bfloat16"
    activation_dtype: str | None = None  # default: weight_dtype
    master_weights: bool = False  # fp32 master copy of 16-bit weights (DeepSpeed bf16; FSDP upcasts instead)
    optimizer_state_dtype: str = "float32"  # AdamW moments
    gradient_checkpointing: bool = True
    sharding: str = "none"
    num_devices: int = 1
    critic: bool = False  # a separate full critic model (RAGEN-2's PPO)
    value_head: bool = False  # a Linear(hidden, 1) value head (PPO; the separate critic has one too)
    reference_model: bool = False  # frozen reference weights for a KL penalty (beta > 0)
    use_vllm: bool = False
    vllm_gpu_memory_utilization: float = 0.3

    def __post_init__(self) -> None:
        if self.sharding not in SHARDING:
            raise ValueError(f"sharding must be one of {sorted(SHARDING)}, got {self.sharding!r}")
        for name in ("per_device_batch", "num_devices"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.prompt_length < 0 or self.completion_length < 1:
            raise ValueError("prompt_length must be >= 0 and completion_length >= 1")
        if not 0.0 <= self.vllm_gpu_memory_utilization < 1.0:
            raise ValueError("vllm_gpu_memory_utilization must be in [0, 1)")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per component on one device; ``total`` is their sum."""

    components: dict[str, int]
    parameters: int

    @property
    def total(self) -> int:
        return sum(self.components.values())

    def gib(self) -> dict[str, float]:
        return {k: v / GIB for k, v in {**self.components, "total": self.total}.items()}


def model_state_bytes(shape: ModelShape, setup: TrainingSetup) -> dict[str, int]:
    """Weights, gradients and AdamW state of one model on one device (exact without sharding)."""
    n = shape.parameters()
    w = dtype_bytes(setup.weight_dtype)
    split_w, split_g, split_o = SHARDING[setup.sharding]
    d = setup.num_devices

    def share(total: int, split: bool) -> int:
        return math.ceil(total / d) if split else total

    opt = n * 2 * dtype_bytes(setup.optimizer_state_dtype) + 4 * shape.parameter_tensors()
    if setup.master_weights and w < 4:
        opt += 4 * n
    return {
        "weights": share(n * w, split_w),
        "gradients": share(n * w, split_g),
        "optimizer": share(opt, split_o),
    }


def activation_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    """Saved activations of one micro-batch (SDPA attention, SwiGLU MLP); an estimate."""
    a = dtype_bytes(setup.activation_dtype or setup.weight_dtype)
    tokens = setup.per_device_batch * (setup.prompt_length + setup.completion_length)
    h, q, kv, inter = (
        shape.hidden_size,
        shape.num_attention_heads * shape.head_dim,
        shape.kv_dim,
        shape.intermediate_size,
    )
    # per token of one layer: norm in, q/k/v in, q/k/v out, attention out (+ fp32 logsumexp per head),
    # o_proj in, residual, norm in, MLP in, gate, up, act(gate) * up, down in
    per_token_layer = (5 * h + q + 2 * kv + 2 * h + 4 * inter) * a + 4 * shape.num_attention_heads
    if setup.gradient_checkpointing:
        return tokens * (shape.num_hidden_layers * h * a + per_token_layer)
    return tokens * shape.num_hidden_layers * per_token_layer


def logits_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    """Completion-token logits of one micro-batch: 16-bit logits plus an fp32 log-softmax buffer."""
    a = dtype_bytes(setup.activation_dtype or setup.weight_dtype)
    return setup.per_device_batch * setup.completion_length * shape.vocab_size * (a + 4)


def kv_cache_bytes(shape: ModelShape, setup: TrainingSetup) -> int:
    """HF ``generate``'s KV cache for the generation batch at full length (0 with vLLM)."""
    if setup.use_vllm:
        return 0
    a = dtype_bytes(setup.activation_dtype or setup.weight_dtype)
    rows = setup.generation_batch or setup.per_device_batch
    return (
        rows
        * (setup.prompt_length + setup.completion_length)
        * shape.num_hidden_layers
        * 2
        * shape.kv_dim
        * a
    )


def estimate_memory(
    config: Mapping[str, Any] | ModelShape, setup: TrainingSetup, *, gpu_gib: float | None = None
) -> MemoryEstimate:
    """Bytes per component on one device (see the module docstring). ``gpu_gib`` sizes the vLLM share."""
    shape = config if isinstance(config, ModelShape) else ModelShape.from_config(config)
    states = model_state_bytes(shape, setup)
    comps = dict(states)
    if SHARDING[setup.sharding][0]:
        # a fully sharded model gathers one layer's full weights at a time (twice with prefetch)
        # in the compute dtype (FSDP's MixedPrecisionPolicy gathers bf16 copies of float32 shards)
        gathered = setup.activation_dtype or setup.weight_dtype
        comps["gathered_layer"] = 2 * shape.layer_parameters() * dtype_bytes(gathered)
    comps["activations"] = activation_bytes(shape, setup)
    comps["logits"] = logits_bytes(shape, setup)
    comps["kv_cache"] = kv_cache_bytes(shape, setup)
    if setup.critic:  # the backbone: embedding, layers and final norm, no (untied) LM head
        critic_states = model_state_bytes(replace(shape, tie_word_embeddings=True), setup)
        comps["critic"] = sum(critic_states.values()) + comps["activations"]
    else:
        comps["critic"] = 0
    # float32 weight, gradient and two AdamW moments per element, plus a step scalar for weight and bias
    comps["value_head"] = (16 * (shape.hidden_size + 1) + 8) if (setup.value_head or setup.critic) else 0
    comps["reference"] = (
        math.ceil(
            shape.parameters()
            * dtype_bytes(setup.weight_dtype)
            / (setup.num_devices if SHARDING[setup.sharding][0] else 1)
        )
        if setup.reference_model
        else 0
    )
    if setup.use_vllm:
        if gpu_gib is None:
            raise ValueError("use_vllm needs gpu_gib: vLLM reserves a share of the GPU's memory")
        comps["vllm"] = int(setup.vllm_gpu_memory_utilization * gpu_gib * GIB)
    else:
        comps["vllm"] = 0
    return MemoryEstimate(components={k: int(v) for k, v in comps.items()}, parameters=shape.parameters())


def precision_setup(precision: Any) -> dict[str, Any]:
    """:class:`TrainingSetup` dtype fields for a :class:`llm_gym.trainer.precision.Precision` (its ``params``,
    ``master`` and ``compute``): the weights and gradients as the module holds them, activations in the compute
    dtype, AdamW moments in the dtype of the copy it updates, and a float32 master copy of 16-bit weights when the
    backend keeps one (DeepSpeed)."""
    params, master, compute = str(precision.params), str(precision.master), str(precision.compute)
    return {
        "weight_dtype": params,
        "activation_dtype": compute,
        "master_weights": master == "float32" and dtype_bytes(params) < 4,
        "optimizer_state_dtype": "float32" if master == "float32" else params,
    }


def fits(total: int, gpu_gib: float, *, headroom: float = 0.1) -> bool:
    """Whether ``total`` bytes fit a ``gpu_gib`` GPU keeping ``headroom`` (a fraction) free for the CUDA
    context, the allocator's fragmentation and temporary buffers."""
    if gpu_gib <= 0 or not 0 <= headroom < 1:
        raise ValueError("gpu_gib must be > 0 and headroom in [0, 1)")
    return total <= gpu_gib * GIB * (1 - headroom)


#: GPU sizes the memory plan checks (GiB of an 80 GB A100/H100 and a 141 GB H200) and the process counts it spans.
PLAN_GPU_GIB = (80.0, 141.0)
PLAN_DEVICES = (1, 2, 4, 8)


def plan_label(sharding: str, num_devices: int) -> str:
    """``1 GPU``, ``DDP x4``, ``FSDP x8``, ``ZERO3 x8``: one row of the memory plan."""
    if num_devices == 1 and sharding == "none":
        return "1 GPU"
    return f"{'DDP' if sharding == 'none' else sharding.upper()} x{num_devices}"


def format_plan(rows: list[tuple[str, dict[float, int]]], gpu_gibs: tuple[float, ...] = PLAN_GPU_GIB) -> str:
    """The plan as text: one row per setting with its per-GPU total (GiB) and whether it fits each GPU size
    (10% headroom). ``rows``: ``(label, {gpu_gib: total bytes})`` (the total depends on the GPU size only through
    vLLM's share)."""
    head = f"{'setting':<10}{'GiB per GPU':>12}" + "".join(f"{f'fits {g:g} GiB':>14}" for g in gpu_gibs)
    lines = [head]
    for label, totals in rows:
        first = totals[gpu_gibs[0]]
        shown = (
            f"{first / GIB:.1f}"
            if len(set(totals.values())) == 1
            else "/".join(f"{totals[g] / GIB:.1f}" for g in gpu_gibs)
        )
        lines.append(
            f"{label:<10}{shown:>12}"
            + "".join(f"{('yes' if fits(totals[g], g) else 'no'):>14}" for g in gpu_gibs)
        )
    return "\n".join(lines)


def format_table(estimate: MemoryEstimate, measured: Mapping[str, float] | None = None) -> str:
    """A text table of the estimate in GiB, with a measured column when given (same keys, GiB)."""
    rows = estimate.gib()
    lines = [f"{'component':<16}{'estimate GiB':>14}" + (f"{'measured GiB':>14}" if measured else "")]
    for key, value in rows.items():
        line = f"{key:<16}{value:>14.3f}"
        if measured:
            m = measured.get(key)
            line += f"{m:>14.3f}" if m is not None else f"{'-':>14}"
        lines.append(line)
    return "\n".join(lines)
