"""Evaluation throughput: llmgym-eval's batched path vs a plain one-episode-at-a-time loop.

Both play the same seeds of one environment with the same model, sampling settings and reply budget. The
reference loop is what one writes first: reset an env, then per turn render the chat, ``generate`` for that
single conversation, step, repeat; then the next episode. llmgym-eval instead advances all episodes together,
one left-padded batched ``generate`` per turn (``trainer.evaluate.evaluate`` with ``trainer.policies.HFPolicy``).

    OMP_NUM_THREADS=1 python benchmarks/eval_throughput.py --model smollm2 --episodes 8 --max-new-tokens 32
    OMP_NUM_THREADS=1 python benchmarks/eval_throughput.py --model tiny        # seconds, random tiny model
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import _offline  # noqa: F401  (offline env vars and repo path, before any torch import)


def reference_loop(model, tok, env_id: str, seeds: list[int], sampling, env_kwargs: dict) -> tuple[int, int]:
    """One episode at a time, one conversation per ``generate``. Returns (episodes, generated tokens)."""
    import torch
    from transformers import GenerationConfig

    from llm_gym.agent.chat import Conversation
    from llm_gym.agent.rollout import make_env

    gen = GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        do_sample=sampling.temperature > 0,
        temperature=sampling.temperature or None,
        top_p=sampling.top_p,
        top_k=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    tokens = 0
    for seed in seeds:
        env = make_env(env_id, env_kwargs)
        obs, _ = env.reset(seed=seed)
        conv = Conversation(env)
        conv.add_observation(obs)
        done = False
        while not done:
            text = tok.apply_chat_template(conv.messages(), add_generation_prompt=True, tokenize=False)
            ids = tok(text, return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                out = model.generate(**ids, generation_config=gen)
            new = out[0, ids["input_ids"].shape[1] :]
            tokens += int(new.numel())
            reply = tok.decode(new, skip_special_tokens=True)
            obs, reward, terminated, truncated, info = env.step(reply)
            conv.add_reply(reply)
            done = terminated or truncated
            if not done:
                conv.add_observation(obs, reward=reward, info=info)
        env.close()
    return len(seeds), tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="'smollm2' (offline SmolLM2-135M), 'tiny' or a folder")
    p.add_argument("--env", default="FrozenLake")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--max-turns", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)

    import torch
    from llm_gym.trainer.evaluate import evaluate, resolve_env_id
    from llm_gym.trainer.models import load_model_and_tokenizer
    from llm_gym.trainer.policies import HFPolicy, SamplingParams

    from tests._tiny import build_tiny_model

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    name = build_tiny_model(tempfile.mkdtemp(prefix="bench_tiny_")) if a.model == "tiny" else a.model
    model, tok = load_model_and_tokenizer(name, dtype="float32")
    model.eval()
    env_id = resolve_env_id(a.env)
    env_kwargs = {"max_turns": a.max_turns}
    seeds = list(range(10_000, 10_000 + a.episodes))
    sampling = SamplingParams(a.temperature, 1.0, a.max_new_tokens)
    print(
        f"model={a.model} env={env_id} episodes={a.episodes} max_new_tokens={a.max_new_tokens} "
        f"temperature={a.temperature} threads={torch.get_num_threads()}"
    )

    torch.manual_seed(a.seed)
    with torch.no_grad():  # warm-up, so neither side pays first-call costs
        model.generate(**tok("hi", return_tensors="pt"), max_new_tokens=2, do_sample=False)

    torch.manual_seed(a.seed)
    t0 = time.perf_counter()
    n_ref, tok_ref = reference_loop(model, tok, env_id, seeds, sampling, env_kwargs)
    t_ref = time.perf_counter() - t0

    torch.manual_seed(a.seed)
    policy = HFPolicy(model, tok, sampling)
    out = os.path.join(tempfile.mkdtemp(prefix="bench_eval_"), "episodes.jsonl")
    t0 = time.perf_counter()
    result = evaluate(
        policy,
        [env_id],
        seeds,
        output=out,
        fingerprint={"model": a.model},
        env_kwargs=env_kwargs,
        batch_size=a.episodes,
        progress=False,
    )
    t_batch = time.perf_counter() - t0
    n_batch, tok_batch = result["episodes_played"], policy.generated_tokens

    rows = [
        ("one-at-a-time loop (reference)", n_ref, tok_ref, t_ref),
        ("llmgym-eval batched", n_batch, tok_batch, t_batch),
    ]
    print(
        f"{'path':32s} {'episodes':>8s} {'tokens':>7s} {'seconds':>8s} {'episodes/min':>12s} {'tokens/s':>9s}"
    )
    for label, n, tk, t in rows:
        print(f"{label:32s} {n:8d} {tk:7d} {t:8.2f} {60 * n / t:12.2f} {tk / t:9.1f}")
    print(f"speed-up (episodes/min, batched / reference): {t_ref / t_batch * n_batch / n_ref:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
