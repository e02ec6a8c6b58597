"""The plain-PyTorch control for the organism's sample efficiency: a small causal transformer trained from scratch
outside our pipeline, on the same solver episodes ``llmgym-sft`` trains on.

It answers "how well can a tiny transformer learn this task from these examples at all?", so our SFT can be
held to it. Every solver move of the exported episodes is one example: the env's observation text read one
character at a time (no chat, no tokenizer, no answer format), the solver's move as one of the env's
``action_names`` (the loss on the decision only). A two-layer pre-norm transformer (d_model 64, 4 heads, MLP
256, learned absolute positions; ~120k parameters, the size of ``organism-s``) reads it causally and classifies
the move from the last position. It is evaluated as our models are: greedy play of whole episodes on held-out
seeds, each move sent as ``<answer>MOVE</answer>``, with a Wilson interval.

    OMP_NUM_THREADS=1 python benchmarks/plain_control.py --data rows.jsonl --num_seeds 512
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _offline  # noqa: E402, F401  (offline, single-threaded)


def solver_states(rows_path: str | Path) -> tuple[list[str], list[int], list[str]]:
    """``(observations, moves, action_names)``: every move of the exported episodes, replayed in the env so the
    control reads the env's observation text itself (the rows' user messages wrap it in chat text)."""
    import gymnasium as gym

    import llm_gym  # noqa: F401  (registers the ids)
    from llm_gym.core.parsing import parse_response

    observations: list[str] = []
    moves: list[int] = []
    names: list[str] = []
    with open(rows_path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            kwargs = row.get("env_kwargs") or {}
            env = gym.make(row["env_id"], **(json.loads(kwargs) if isinstance(kwargs, str) else kwargs))
            names = list(env.unwrapped.action_names)
            obs, _ = env.reset(seed=int(row["seed"]))
            for message in row["messages"]:
                if message["role"] != "assistant":
                    continue
                actions = parse_response(message["content"], think=False).actions
                if len(actions) != 1 or actions[0] not in names:
                    raise ValueError(
                        f"seed {row['seed']}: expected one move a turn, got {message['content']!r}"
                    )
                observations.append(obs)
                moves.append(names.index(actions[0]))
                obs, _, terminated, truncated, _ = env.step(message["content"])
                if terminated or truncated:
                    break
            env.close()
    return observations, moves, names


class Control:
    """The character-level classifier and its vocabulary (built from the training observations; an unseen
    character reads as index 0)."""

    def __init__(self, observations: Sequence[str], num_moves: int, seed: int = 0, max_len: int = 512):
        import torch
        from torch import nn

        self.chars = {c: i + 1 for i, c in enumerate(sorted({c for o in observations for c in o}))}
        self.max_len = max_len
        torch.manual_seed(seed)
        d = 64
        self.embed = nn.Embedding(len(self.chars) + 2, d)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, 4, 256, dropout=0.1, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, num_moves)
        self.modules = nn.ModuleList([self.embed, self.pos, self.body, self.head])

    def encode(self, texts: Sequence[str]) -> tuple[Any, Any]:
        import torch

        rows = [[self.chars.get(c, 0) for c in t][-self.max_len :] for t in texts]
        length = max(len(r) for r in rows)
        ids = torch.full((len(rows), length), len(self.chars) + 1)  # padding after the text
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        return ids, torch.tensor([len(r) - 1 for r in rows])

    def logits(self, texts: Sequence[str]) -> Any:
        import torch

        ids, last = self.encode(texts)
        n = ids.size(1)
        x = self.embed(ids) + self.pos(torch.arange(n))
        causal = torch.nn.Transformer.generate_square_subsequent_mask(n)
        h = self.body(x, mask=causal, is_causal=True)
        return self.head(h[torch.arange(len(texts)), last])


def train_control(
    observations: Sequence[str], moves: Sequence[int], num_moves: int, *, steps: int = 300, batch: int = 64,
    lr: float = 1e-3, seed: int = 0,
) -> tuple[Control, dict[str, float]]:  # fmt: skip
    """Adam on the move's cross-entropy, ``steps`` batches drawn with replacement-free epochs."""
    import torch

    model = Control(observations, num_moves, seed=seed)
    opt = torch.optim.Adam(model.modules.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    target = torch.tensor(list(moves))
    order: list[int] = []
    t0 = time.process_time()
    model.modules.train()
    for _ in range(steps):
        if len(order) < batch:
            order += torch.randperm(len(moves), generator=gen).tolist()
        idx, order = order[:batch], order[batch:]
        loss = torch.nn.functional.cross_entropy(model.logits([observations[i] for i in idx]), target[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.modules.eval()
    return model, {"train_cpu_seconds": time.process_time() - t0, "final_loss": loss.item()}


def play(model: Control, env_id: str, env_kwargs: dict[str, Any], seeds: Sequence[int]) -> dict[str, Any]:
    """Greedy episodes on ``seeds``: success with its Wilson interval (``rate_with_interval``)."""
    import gymnasium as gym
    import torch

    import llm_gym  # noqa: F401
    from llm_gym.agent.baselines import rate_with_interval

    envs = [gym.make(env_id, **env_kwargs) for _ in seeds]
    names = list(envs[0].unwrapped.action_names)
    obs = [env.reset(seed=int(s))[0] for env, s in zip(envs, seeds, strict=True)]
    live = list(range(len(envs)))
    wins = 0
    with torch.no_grad():
        while live:
            moves = model.logits([obs[i] for i in live]).argmax(-1).tolist()
            still = []
            for i, m in zip(live, moves, strict=True):
                obs[i], _, terminated, truncated, info = envs[i].step(f"<answer>{names[m]}</answer>")
                if terminated or truncated:
                    wins += bool(info.get("success"))
                else:
                    still.append(i)
            live = still
    return rate_with_interval(wins, len(seeds))


def run(
    rows_path: str | Path, env_id: str, env_kwargs: dict[str, Any], seeds: Sequence[int], *, seed: int = 0,
    steps: int = 300,
) -> dict[str, Any]:  # fmt: skip
    """Train the control on every solver move of ``rows_path`` and play ``seeds``: the record the organism
    benchmark and the regression test compare our SFT against."""
    observations, moves, names = solver_states(rows_path)
    model, stats = train_control(observations, moves, len(names), steps=steps, seed=seed)
    return {"states": len(moves), "steps": steps, "seed": seed, "success": play(model, env_id, env_kwargs, seeds),
            **stats}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", required=True, help="solver episodes exported by `llmgym export --policy expert`"
    )
    ap.add_argument("--num_seeds", type=int, default=512)
    ap.add_argument("--seed_start", type=int, default=200_000)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    first = json.loads(Path(args.data).open(encoding="utf-8").readline())
    seeds = range(args.seed_start, args.seed_start + args.num_seeds)
    kwargs = first.get("env_kwargs") or {}
    kwargs = json.loads(kwargs) if isinstance(kwargs, str) else kwargs
    result = run(args.data, first["env_id"], kwargs, seeds, seed=args.seed, steps=args.steps)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
