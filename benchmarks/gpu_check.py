"""GPU self-check: a profile's generation and update at the real model shape, with random weights, next to the
memory estimate.

Sizes a run before a long job: builds the model from its ``config.json`` alone (random initialisation, nothing
downloaded; Qwen2.5-3B's config ships in ``trainer/model_configs/``), reads the batch and length settings of a
training profile (``trainer/profiles/<profile>/<env>.yaml``), and times a few rounds of

- generation: the round's rollouts on this device (``num_prompts x num_generations`` rows), ``max_turns`` turns
  of ``max_new_tokens`` forced tokens each (EOS ignored) on a context that grows by a synthetic observation
  per turn, with HF ``generate`` or, with ``--use_vllm``, vLLM (``load_format="dummy"``: random weights);
- update: the same rows as micro-batches of ``per_device_train_batch_size``, forward + token log-prob loss +
  backward, one AdamW step per ``gradient_accumulation_steps`` micro-batches (gradient checkpointing as the
  profile says);

and reports generation tokens/s, update seconds per optimizer step and per round, peak memory of the device per
phase (CUDA: ``max_memory_allocated``; CPU: the process's peak RSS), and the estimate of
:mod:`llm_gym.trainer.memory` for the same settings side by side. It also reports what a GPU run will show first:

- the parameter dtype after ``llmgym-train``'s loading path (:func:`llm_gym.trainer.precision.load_for_training`
  on a 2-layer copy of the shape saved in bfloat16, as checkpoints ship): float32 unless ``dtype: bfloat16``;
- the fraction of trainable elements one optimizer step with the profile's settings (learning rate, weight
  decay, betas, gradient clipping; ``ragen2``: lr 1e-6) changes, on the weights the check trains;
- whether generation stops at ``<|im_end|>`` for a base model (eos ``<|endoftext|>``, turns closed by
  ``<|im_end|>``): HF ``generate`` through llm-gym's rollout backend, and with ``--use_vllm`` vLLM with the stop
  tokens llm-gym passes, each next to the eos-only default, with ``<|im_end|>`` forced as the first token. The reference in the same run is that
estimate (ratio measured / estimated). Single device: for DDP / FSDP / ZeRO, run it on one GPU and read the
sharded estimate (``--sharding``, ``--num_devices``).

    python benchmarks/gpu_check.py --env sokoban                       # recommended profile, Qwen2.5-3B shape
    python benchmarks/gpu_check.py --env sokoban --use_vllm --json gpu_check.json
    python benchmarks/gpu_check.py --env bandit --model_config my/config.json --set per_device_train_batch_size=4

Untrusted inputs are bounded: the profile and config are parsed as plain YAML / JSON, and ``--max_tokens``
caps the tokens a round may generate.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _offline  # noqa: F401  (offline env vars and repo path, before any torch import)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "trainer" / "model_configs" / "Qwen" / "Qwen2.5-3B" / "config.json"
#: Profile keys the check reads, with the values used when a profile leaves them out.
DEFAULTS = {
    "num_prompts": 8,
    "num_generations": 16,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_new_tokens": 100,
    "max_completion_length": 512,
    "max_turns": 1,
    "gradient_checkpointing": True,
    "bf16": True,
    "dtype": "float32",
    "learning_rate": 1e-6,
    "weight_decay": 0.01,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "max_grad_norm": 1.0,
    "beta": 0.0,
    "vllm_gpu_memory_utilization": 0.3,
    "algo": "grpo",
    "critic_model": "head",
}


def load_profile(env: str, profile: str = "recommended", path: str | None = None) -> dict:
    """The profile's YAML as a dict (``path`` wins over ``env`` / ``profile``)."""
    import yaml

    if path is None:
        import llm_gym.trainer as pkg
        from llm_gym.trainer.resolve import load_profile as load_merged

        # the environment's file on top of the profile's _common.yaml, as llmgym-train reads it
        data = load_merged(Path(pkg.__file__).parent / "profiles" / profile / f"{env.lower()}.yaml")
        return {k: v for k, v in data.items() if k != "per_algo"}
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f.read(1_000_000)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a profile must be a YAML mapping")
    return data


def settings_from(profile: dict, overrides: list[str]) -> dict:
    """The check's settings: ``DEFAULTS`` <- profile <- ``--set key=value`` (YAML-parsed values)."""
    import yaml

    out = {k: profile.get(k, v) for k, v in DEFAULTS.items()}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in DEFAULTS:
            raise ValueError(f"--set expects key=value with key in {sorted(DEFAULTS)}, got {item!r}")
        out[key] = yaml.safe_load(value)
    from llm_gym.trainer.algorithms import get_algorithm

    try:
        get_algorithm(str(out["algo"]))
    except KeyError:
        raise ValueError(f"algo must be one of grpo, drgrpo, dapo, ppo, got {out['algo']!r}") from None
    for key in (
        "num_prompts",
        "num_generations",
        "per_device_train_batch_size",
        "max_new_tokens",
        "max_turns",
    ):
        if not isinstance(out[key], int) or out[key] < 1:
            raise ValueError(f"{key} must be a positive integer, got {out[key]!r}")
    return out


def plan(settings: dict, prompt_length: int, max_tokens: int) -> dict:
    """Rows, per-turn token budgets and micro-batching of one round on one device."""
    rows = settings["num_prompts"] * settings["num_generations"]
    turns, per_turn, budget = [], settings["max_new_tokens"], settings["max_completion_length"]
    obs = 16  # synthetic observation tokens between turns
    used = 0
    for t in range(settings["max_turns"]):
        n = min(per_turn, budget - used - (obs if t else 0))
        if n < 1:
            break
        turns.append(n)
        used += n + (obs if t else 0)
    if rows * sum(turns) > max_tokens:
        raise ValueError(f"a round would generate {rows * sum(turns)} tokens > --max_tokens {max_tokens}")
    mb = settings["per_device_train_batch_size"]
    micro = math.ceil(rows / mb)
    ga = max(1, int(settings["gradient_accumulation_steps"]))
    return {
        "rows": rows,
        "turn_tokens": turns,
        "observation_tokens": obs,
        "prompt_length": prompt_length,
        "completion_length": used,
        "micro_batches": micro,
        "optimizer_steps": math.ceil(micro / ga),
        "gradient_accumulation_steps": ga,
    }


def estimate_setup(settings: dict, p: dict, precision: Any, sharding: str = "none", num_devices: int = 1):
    """The :class:`llm_gym.trainer.memory.TrainingSetup` of the whole run the settings describe: the round on this
    device, the weights as :mod:`llm_gym.trainer.precision` keeps them, and the models the check does not build
    (PPO's separate critic and value head, a KL reference), so that ``fits`` speaks for the real run."""
    from llm_gym.trainer.algorithms import get_algorithm
    from llm_gym.trainer.memory import TrainingSetup, precision_setup

    uses_critic = get_algorithm(str(settings["algo"])).uses_critic
    return TrainingSetup(
        per_device_batch=settings["per_device_train_batch_size"],
        prompt_length=p["prompt_length"],
        completion_length=p["completion_length"],
        generation_batch=p["rows"],
        **precision_setup(precision),
        gradient_checkpointing=bool(settings["gradient_checkpointing"]),
        sharding=sharding,
        num_devices=num_devices,
        critic=uses_critic and settings["critic_model"] == "separate",
        value_head=uses_critic,
        reference_model=float(settings["beta"]) != 0.0,
    )


class Meter:
    """Peak memory of the device (CUDA) or of the process (CPU), resettable per phase on CUDA."""

    def __init__(self, device):
        self.device = device

    def reset(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def peak_bytes(self) -> int:
        import torch

        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(rss * (1 if sys.platform == "darwin" else 1024))


def build_model(config: dict, dtype, device, gradient_checkpointing: bool):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        **{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")}
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if gradient_checkpointing:
        from llm_gym.trainer.deprecations import enable_activation_checkpointing

        enable_activation_checkpointing(model)
    model.config.use_cache = True
    return model


def generate_hf(model, p: dict, vocab: int, device) -> tuple[list, int]:
    """Rollout-shaped generation with HF ``generate``; returns the token rows and the tokens generated."""
    import torch

    g = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, vocab, (p["rows"], p["prompt_length"]), generator=g)
    new_total = 0
    model.eval()
    with torch.no_grad():
        for t, n in enumerate(p["turn_tokens"]):
            if t:
                obs = torch.randint(0, vocab, (p["rows"], p["observation_tokens"]), generator=g)
                ctx = torch.cat([ctx, obs], 1)
            out = model.generate(
                input_ids=ctx.to(device),
                attention_mask=torch.ones_like(ctx, device=device),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                pad_token_id=0,
                eos_token_id=None,
            )
            ctx = out.cpu()
            new_total += p["rows"] * n
    return ctx, new_total


def generate_vllm(
    model_dir: str, p: dict, vocab: int, utilization: float, dtype: str
) -> tuple[Any, int, float, int]:
    """The same generation through vLLM with random (dummy) weights; returns (rows, tokens, seconds, bytes in use
    on the device while the engine is alive). vLLM's engine runs in its own process by default, so this process's
    ``max_memory_allocated`` does not see it: the device-wide figure (``torch.cuda.mem_get_info``) does."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        gpu_memory_utilization=utilization,
        dtype=dtype,
        max_model_len=p["prompt_length"] + p["completion_length"] + 8,
        seed=0,
    )
    import torch

    g = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, vocab, (p["rows"], p["prompt_length"]), generator=g).tolist()
    start, total = time.perf_counter(), 0
    for t, n in enumerate(p["turn_tokens"]):
        if t:
            ctx = [c + torch.randint(0, vocab, (p["observation_tokens"],), generator=g).tolist() for c in ctx]
        sp = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=1.0, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": c} for c in ctx], sp, use_tqdm=False)
        ctx = [c + list(o.outputs[0].token_ids) for c, o in zip(ctx, outs)]
        total += sum(len(o.outputs[0].token_ids) for o in outs)
    seconds = time.perf_counter() - start
    free, device_total = torch.cuda.mem_get_info()
    del llm  # shut the engine down before the stop check starts its own
    gc.collect()
    return ctx, total, seconds, int(device_total - free)


def autocast(device, bf16: bool):
    """bf16 autocast on ``device`` when ``bf16`` (what ``bf16=True`` means for llmgym-train), else a no-op."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(bf16))


def micro_batch_backward(model, ids, completion: int, scale: float) -> None:
    """Forward + completion log-prob loss + backward of one micro-batch (under the caller's autocast)."""
    import torch

    logits = model(input_ids=ids, logits_to_keep=completion + 1).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -completion:, None]).squeeze(-1)
    (-logp.mean() * scale).backward()


def update(
    model, optimizer, seqs, p: dict, mb: int, device, meter: Meter, bf16: bool = False, max_grad_norm=None
) -> list[float]:
    """Micro-batched forward + completion log-prob loss + backward; AdamW step every ga micro-batches.
    Returns the seconds of each optimizer step."""
    import torch

    model.train()
    completion = p["completion_length"]
    ga = p["gradient_accumulation_steps"]
    times, start = [], time.perf_counter()
    for i in range(p["micro_batches"]):
        ids = seqs[i * mb : (i + 1) * mb].to(device)
        with autocast(device, bf16):
            micro_batch_backward(model, ids, completion, 1 / ga)
        if (i + 1) % ga == 0 or i + 1 == p["micro_batches"]:
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), float(max_grad_norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # keep the gradient buffers, as the trainer does
            meter.sync()
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
    return times


def loading_check(config: dict, settings: dict, device) -> dict:
    """The dtype ``llmgym-train``'s loading path gives the weights on this device: a 2-layer copy of the shape,
    saved in bfloat16 as published checkpoints are, loaded by :func:`llm_gym.trainer.precision.load_for_training`
    with the profile's ``dtype`` and ``bf16``."""
    from types import SimpleNamespace

    import torch
    from llm_gym.trainer.precision import load_for_training, trainable_dtypes

    from tests._tiny import build_tiny_tokenizer

    small = {**config, "num_hidden_layers": 2, "max_window_layers": 2}
    model = build_model(small, torch.bfloat16, torch.device("cpu"), False)
    run = SimpleNamespace(
        dtype=settings["dtype"],
        bf16=bool(settings["bf16"]),
        fp16=False,
        use_cpu=device.type == "cpu",
        use_peft=False,
        lora_modules_to_save=None,
        chat_template=None,
        deepspeed=None,
        fsdp=None,
    )
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        build_tiny_tokenizer("chatml").save_pretrained(d)
        del model
        loaded, _, precision = load_for_training(d, run, gpu=device.type == "cuda", log=None)
    return {
        "checkpoint_dtype": "bfloat16",
        "parameter_dtypes": trainable_dtypes(loaded),
        "load": precision.load,
        "master": precision.master,
        "compute": precision.compute,
        "reason": precision.reason,
        "warning": precision.warning,
    }


def step_change(model, optimizer, seqs, p: dict, mb: int, device, settings: dict) -> dict:
    """The fraction of trainable elements one optimizer step with the profile's settings changes (one
    micro-batch; the snapshot is kept on the CPU)."""
    import torch
    from llm_gym.trainer.precision import changed_fraction

    before = {n: t.detach().to("cpu", copy=True) for n, t in model.named_parameters() if t.requires_grad}
    optimizer.zero_grad(set_to_none=False)
    model.train()
    with autocast(device, settings["bf16"]):
        micro_batch_backward(model, seqs[:mb].to(device), p["completion_length"], 1.0)
    torch.nn.utils.clip_grad_norm_(model.parameters(), float(settings["max_grad_norm"]))
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return {
        "learning_rate": float(settings["learning_rate"]),
        "changed_fraction": changed_fraction(model, before),
        "parameter_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }


def _force_token(model, token_id: int):
    """Make ``token_id`` the most likely next token at every step (a hook on the LM head's output), so that
    whether generation stops there depends on the stop tokens alone."""

    def hook(module, args, output):
        output[..., token_id] += 1e4
        return output

    return model.get_output_embeddings().register_forward_hook(hook)


def hf_stop_check(device, max_new_tokens: int = 16) -> dict:
    """Does HF ``generate`` stop at ``<|im_end|>`` for a base model? The tiny ChatML model set up as Qwen2.5
    base is (eos ``<|endoftext|>``), through llm-gym's rollout backend (``HFGenerate`` with
    ``template_stop_ids``) and with the model's eos alone, ``<|im_end|>`` forced as the first token."""
    import torch
    from llm_gym.trainer.chat_templates import template_stop_ids
    from llm_gym.trainer.models import load_model_and_tokenizer
    from llm_gym.trainer.rollouts import HFGenerate

    from tests._tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as d:
        model, tok = load_model_and_tokenizer(build_tiny_model(d), dtype="float32")
    # Qwen2.5 base: ChatML tokens are special, eos is <|endoftext|> in the tokenizer and the generation config
    tok.add_special_tokens({"extra_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|endoftext|>"
    eos, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = eos
    model.to(device).eval()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    prompt = list(tok(text, add_special_tokens=False)["input_ids"])
    stop_ids = template_stop_ids(tok)
    handle = _force_token(model, im_end)
    try:
        gen = HFGenerate(model, tok, model.generation_config, stop_ids, device)
        ours = gen([prompt], [max_new_tokens])[0][0]
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([prompt], device=device),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        default = out[0, len(prompt) :].tolist()
    finally:
        handle.remove()
    return {
        "stop_ids": stop_ids,
        "im_end_id": im_end,
        "llmgym_tokens": len(ours),
        "llmgym_stops_at_im_end": ours[:1] == [im_end] and len(ours) == 1,
        "eos_only_tokens": len(default),
        "eos_only_stops_at_im_end": len(default) == 1,
    }


def vllm_stop_check(max_new_tokens: int = 16, utilization: float = 0.2) -> dict:
    """Does vLLM stop at ``<|im_end|>`` for a base model? Qwen2.5-0.5B's shape with dummy weights and its base
    generation config (eos ``<|endoftext|>``), with the stop tokens llm-gym passes (``vllm_stop_kwargs``) and
    without, ``<|im_end|>`` forced by a logit bias. CUDA only."""
    from llm_gym.trainer.rollouts import vllm_stop_kwargs
    from vllm import LLM, SamplingParams

    cfg_path = ROOT / "trainer" / "model_configs" / "Qwen" / "Qwen2.5-0.5B" / "config.json"
    endoftext, im_end = 151643, 151645  # Qwen2.5's ids
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
            f.write(cfg_path.read_text())
        with open(os.path.join(d, "generation_config.json"), "w", encoding="utf-8") as f:
            json.dump({"bos_token_id": endoftext, "eos_token_id": endoftext, "do_sample": False}, f)
        llm = LLM(
            model=d,
            load_format="dummy",
            skip_tokenizer_init=True,
            gpu_memory_utilization=utilization,
            max_model_len=256,
            seed=0,
        )
        prompt = [{"prompt_token_ids": [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]}]
        lengths = {}
        for name, extra in (("llmgym", vllm_stop_kwargs([endoftext, im_end])), ("eos_only", {})):
            sp = SamplingParams(
                max_tokens=max_new_tokens,
                temperature=1.0,
                logit_bias={im_end: 100.0},
                detokenize=False,
                **extra,
            )
            out = llm.generate(prompt, sp, use_tqdm=False)[0].outputs[0]
            lengths[name] = list(out.token_ids)
        del llm
    return {
        "llmgym_tokens": len(lengths["llmgym"]),
        "llmgym_stops_at_im_end": lengths["llmgym"] == [im_end],
        "eos_only_tokens": len(lengths["eos_only"]),
        "eos_only_stops_at_im_end": len(lengths["eos_only"]) == 1,
    }


def state_bytes(model, optimizer) -> dict[str, int]:
    """Bytes of the parameters, gradients and optimizer state actually allocated (exact)."""
    import torch

    params = list(model.parameters())
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts if t is not None)  # noqa: E731
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"weights": size(params), "gradients": size(p.grad for p in params), "optimizer": size(state)}


def run_check(args: argparse.Namespace) -> dict:
    import torch
    from llm_gym.trainer.memory import GIB, estimate_memory, fits
    from llm_gym.trainer.precision import decide_precision

    with open(args.model_config, encoding="utf-8") as f:
        config = json.loads(f.read(1_000_000))
    settings = settings_from(load_profile(args.env, args.profile, args.profile_file), args.set or [])
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    bf16 = bool(settings["bf16"])
    # the weights as llmgym-train keeps them (float32 master weights unless dtype: bfloat16); bf16 = autocast
    run = argparse.Namespace(dtype=settings["dtype"], bf16=bf16, fp16=False, use_cpu=device.type == "cpu")
    precision = decide_precision(run, gpu=device.type == "cuda", backend="none", lora=False)
    dtype_name = precision.params
    dtype = getattr(torch, dtype_name)
    p = plan(settings, args.prompt_length, args.max_tokens)
    vocab = int(config["vocab_size"])
    meter = Meter(device)
    mb = settings["per_device_train_batch_size"]
    loading = loading_check(config, settings, device)
    stops = {"hf_generate": hf_stop_check(device)}

    model = build_model(config, dtype, device, bool(settings["gradient_checkpointing"]))
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=float(settings["learning_rate"]),
        betas=(float(settings["adam_beta1"]), float(settings["adam_beta2"])),
        weight_decay=float(settings["weight_decay"]),
    )
    rounds = []
    for _ in range(args.steps):
        meter.reset()
        start = time.perf_counter()
        with autocast(device, bf16):
            seqs, tokens = generate_hf(model, p, vocab, device)
        meter.sync()
        gen_s = time.perf_counter() - start
        gen_peak = meter.peak_bytes()
        meter.reset()
        step_s = update(
            model, optimizer, seqs, p, mb, device, meter, bf16=bf16, max_grad_norm=settings["max_grad_norm"]
        )
        rounds.append(
            {
                "generation_seconds": gen_s,
                "generated_tokens": tokens,
                "generation_tokens_per_s": tokens / gen_s,
                "generation_peak_bytes": gen_peak,
                "update_seconds": sum(step_s),
                "optimizer_step_seconds": statistics.median(step_s),
                "update_peak_bytes": meter.peak_bytes(),
            }
        )
    measured_states = state_bytes(model, optimizer)
    one_step = step_change(model, optimizer, seqs, p, mb, device, settings)
    estimate = estimate_memory(
        config, estimate_setup(settings, p, precision, args.sharding, args.num_devices)
    )
    c = estimate.components
    last = rounds[-1]  # the first round includes warm-up (allocator growth, kernel selection)
    est_update = sum(c[k] for k in ("weights", "gradients", "optimizer", "activations", "logits"))
    est_generation = c["weights"] + c["gradients"] + c["optimizer"] + c["kv_cache"]
    report = {
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "dtype": dtype_name,
        "compute_dtype": precision.compute,
        "loading": loading,
        "one_step": one_step,
        "stops_at_im_end": stops,
        "parameters": estimate.parameters,
        "settings": settings,
        "plan": p,
        "rounds": rounds,
        "generation_tokens_per_s": last["generation_tokens_per_s"],
        "update_seconds_per_round": last["update_seconds"],
        "optimizer_step_seconds": last["optimizer_step_seconds"],
        "peak_memory_bytes": {str(device): max(last["generation_peak_bytes"], last["update_peak_bytes"])},
        "measured_state_bytes": measured_states,
        "estimate_bytes": {**c, "total": estimate.total},
        "side_by_side": {
            "model_states": [sum(measured_states.values()), c["weights"] + c["gradients"] + c["optimizer"]],
            "generation_peak": [last["generation_peak_bytes"], est_generation],
            "update_peak": [last["update_peak_bytes"], est_update],
        },
    }
    if args.gpu_gib:
        report["fits"] = {"gpu_gib": args.gpu_gib, "estimate_fits": fits(estimate.total, args.gpu_gib)}
    if args.use_vllm:
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f)
            _, tokens, secs, used = generate_vllm(
                d, p, vocab, float(settings["vllm_gpu_memory_utilization"]), precision.compute
            )
        stops["vllm"] = vllm_stop_check()
        report["vllm"] = {
            "generation_tokens_per_s": tokens / secs,
            "generated_tokens": tokens,
            "device_used_bytes": used,  # every process on the device, vLLM's engine included
            "gpu_memory_utilization": settings["vllm_gpu_memory_utilization"],
            "reserved_share_bytes": int(
                float(settings["vllm_gpu_memory_utilization"])
                * torch.cuda.get_device_properties(device).total_memory
            )
            if device.type == "cuda"
            else None,
        }
    report["gib"] = GIB
    report["peak_kind"] = "device" if device.type == "cuda" else "process_rss"
    return report


def format_report(r: dict) -> str:
    gib = r["gib"]
    ld, step = r["loading"], r["one_step"]
    lines = [
        f"gpu_check on {r['device']} ({r['dtype']} weights, {r['compute_dtype']} compute, {r['parameters']:,} "
        "parameters, random weights)",
        f"  llmgym-train loading: checkpoint {ld['checkpoint_dtype']} -> parameters {ld['parameter_dtypes']} "
        f"(load {ld['load']}, updates on {ld['master']}, compute {ld['compute']})"
        + (f"; WARNING {ld['warning']}" if ld["warning"] else ""),
        f"  one optimizer step at lr {step['learning_rate']:g} on {step['parameter_dtype']} weights changes "
        f"{step['changed_fraction']:.2%} of the trainable elements",
    ]
    for backend, st in r["stops_at_im_end"].items():
        lines.append(
            f"  base model stops at <|im_end|> ({backend}): llm-gym's stop ids {st['llmgym_stops_at_im_end']} "
            f"({st['llmgym_tokens']} tokens), eos only {st['eos_only_stops_at_im_end']} ({st['eos_only_tokens']} tokens)"
        )
    lines += [
        f"  round: {r['plan']['rows']} rows x {r['plan']['completion_length']} completion tokens "
        f"({len(r['plan']['turn_tokens'])} turns), {r['plan']['micro_batches']} micro-batches, "
        f"{r['plan']['optimizer_steps']} optimizer steps",
        f"  generation (HF generate): {r['generation_tokens_per_s']:,.1f} tokens/s",
    ]
    if "vllm" in r:
        ratio = r["vllm"]["generation_tokens_per_s"] / r["generation_tokens_per_s"]
        lines.append(
            f"  generation (vLLM):        {r['vllm']['generation_tokens_per_s']:,.1f} tokens/s ({ratio:.2f}x HF)"
        )
    lines += [
        f"  update: {r['update_seconds_per_round']:.3f} s per round, {r['optimizer_step_seconds']:.3f} s per optimizer step",
        "",
        f"  {'memory (GiB)':<18}{'measured':>10}{'estimate':>10}{'ratio':>8}"
        + ("" if r["peak_kind"] == "device" else "   (CPU: peaks are the process's RSS, not comparable)"),
    ]
    for key, (m, e) in r["side_by_side"].items():
        lines.append(f"  {key:<18}{m / gib:>10.3f}{e / gib:>10.3f}{(m / e if e else float('nan')):>8.2f}")
    lines.append(
        "  estimate per component: "
        + ", ".join(f"{k} {v / gib:.3f}" for k, v in r["estimate_bytes"].items() if v)
    )
    if r["estimate_bytes"].get("critic") or r["estimate_bytes"].get("reference"):
        lines.append(
            "  (the critic / reference model are in the estimate and its fit only: the check does not run them)"
        )
    if "fits" in r:
        lines.append(
            f"  fits a {r['fits']['gpu_gib']} GiB GPU (estimate, 10% headroom): {r['fits']['estimate_fits']}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--env", default="sokoban", help="profile file name: trainer/profiles/<profile>/<env>.yaml"
    )
    ap.add_argument("--profile", default="recommended")
    ap.add_argument("--profile_file", default=None, help="a profile YAML path (instead of --env/--profile)")
    ap.add_argument("--model_config", default=str(DEFAULT_CONFIG), help="config.json of the model shape")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help=f"override one of {sorted(DEFAULTS)}")
    ap.add_argument("--steps", type=int, default=2, help="rounds (generation + update); the last is reported")
    ap.add_argument(
        "--prompt_length", type=int, default=300, help="prompt tokens per row (system + first state)"
    )
    ap.add_argument("--max_tokens", type=int, default=2_000_000, help="refuse rounds generating more tokens")
    ap.add_argument("--use_vllm", action="store_true", help="also time generation through vLLM (CUDA only)")
    ap.add_argument("--gpu_gib", type=float, default=None, help="say whether the estimate fits this GPU size")
    ap.add_argument("--sharding", default="none", help="estimate column: none, zero1, zero2, zero3 or fsdp")
    ap.add_argument("--num_devices", type=int, default=1, help="estimate column: devices the sharding spans")
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    ap.add_argument("--json", default=None, help="also write the report as JSON to this path")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.use_vllm:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: --use_vllm needs a CUDA GPU", file=sys.stderr)
            return 2
    report = run_check(args)
    print(format_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
