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
:mod:`llm_gym.trainer.memory` for the same settings side by side. The reference in the same run is that
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
    "learning_rate": 1e-6,
    "beta": 0.0,
    "vllm_gpu_memory_utilization": 0.3,
}


def load_profile(env: str, profile: str = "recommended", path: str | None = None) -> dict:
    """The profile's YAML as a dict (``path`` wins over ``env`` / ``profile``)."""
    import yaml

    if path is None:
        import llm_gym.trainer as pkg

        path = str(Path(pkg.__file__).parent / "profiles" / profile / f"{env.lower()}.yaml")
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
        model.gradient_checkpointing_enable()
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
) -> tuple[Any, int, float]:
    """The same generation through vLLM with random (dummy) weights; returns (rows, tokens, seconds)."""
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
    return ctx, total, time.perf_counter() - start


def update(model, optimizer, seqs, p: dict, mb: int, device, meter: Meter) -> list[float]:
    """Micro-batched forward + completion log-prob loss + backward; AdamW step every ga micro-batches.
    Returns the seconds of each optimizer step."""
    import torch

    model.train()
    completion = p["completion_length"]
    ga = p["gradient_accumulation_steps"]
    times, start = [], time.perf_counter()
    for i in range(p["micro_batches"]):
        ids = seqs[i * mb : (i + 1) * mb].to(device)
        logits = model(input_ids=ids, logits_to_keep=completion + 1).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -completion:, None]).squeeze(-1)
        (-logp.mean() / ga).backward()
        del logits, logp
        if (i + 1) % ga == 0 or i + 1 == p["micro_batches"]:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)  # keep the gradient buffers, as the trainer does
            meter.sync()
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
    return times


def state_bytes(model, optimizer) -> dict[str, int]:
    """Bytes of the parameters, gradients and optimizer state actually allocated (exact)."""
    import torch

    params = list(model.parameters())
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts if t is not None)  # noqa: E731
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"weights": size(params), "gradients": size(p.grad for p in params), "optimizer": size(state)}


def run_check(args: argparse.Namespace) -> dict:
    import torch
    from llm_gym.trainer.memory import GIB, TrainingSetup, estimate_memory, fits

    with open(args.model_config, encoding="utf-8") as f:
        config = json.loads(f.read(1_000_000))
    settings = settings_from(load_profile(args.env, args.profile, args.profile_file), args.set or [])
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype_name = "bfloat16" if settings["bf16"] and device.type == "cuda" else "float32"
    dtype = getattr(torch, dtype_name)
    p = plan(settings, args.prompt_length, args.max_tokens)
    vocab = int(config["vocab_size"])
    meter = Meter(device)
    mb = settings["per_device_train_batch_size"]

    model = build_model(config, dtype, device, bool(settings["gradient_checkpointing"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(settings["learning_rate"]))
    rounds = []
    for _ in range(args.steps):
        meter.reset()
        start = time.perf_counter()
        seqs, tokens = generate_hf(model, p, vocab, device)
        meter.sync()
        gen_s = time.perf_counter() - start
        gen_peak = meter.peak_bytes()
        meter.reset()
        step_s = update(model, optimizer, seqs, p, mb, device, meter)
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
    setup = TrainingSetup(
        per_device_batch=mb,
        prompt_length=p["prompt_length"],
        completion_length=p["completion_length"],
        generation_batch=p["rows"],
        weight_dtype=dtype_name,
        optimizer_state_dtype=dtype_name,  # torch AdamW keeps moments in the parameter dtype
        gradient_checkpointing=bool(settings["gradient_checkpointing"]),
        sharding=args.sharding,
        num_devices=args.num_devices,
    )
    estimate = estimate_memory(config, setup)
    c = estimate.components
    last = rounds[-1]  # the first round includes warm-up (allocator growth, kernel selection)
    est_update = sum(c[k] for k in ("weights", "gradients", "optimizer", "activations", "logits"))
    est_generation = c["weights"] + c["gradients"] + c["optimizer"] + c["kv_cache"]
    report = {
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "dtype": dtype_name,
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
            _, tokens, secs = generate_vllm(
                d, p, vocab, float(settings["vllm_gpu_memory_utilization"]), dtype_name
            )
        report["vllm"] = {
            "generation_tokens_per_s": tokens / secs,
            "generated_tokens": tokens,
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device))
            if device.type == "cuda"
            else None,
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
    lines = [
        f"gpu_check on {r['device']} ({r['dtype']}, {r['parameters']:,} parameters, random weights)",
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
