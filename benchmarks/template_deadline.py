"""What the chat-template deadline costs on the normal path: llm-gym's ``render_chat_template`` vs the plain
``tokenizer.apply_chat_template`` call it wraps (the named reference), in the same run.

Both render the same chats with the same tokenizer: a 2-message probe and a 41-message conversation (system,
then 20 turns of a board observation and a reply). Rounds alternate between the two sides, so load from other
processes affects both; the median per-render CPU time (``time.process_time``: the whole process, the watchdog thread included) of each side
and their ratio are printed. The tokenizer is
SmolLM2-135M-Instruct's (``--model smollm2``, offline) when available, else the tests' tiny ChatML tokenizer.

Run: ``OMP_NUM_THREADS=1 python benchmarks/template_deadline.py`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import statistics
import time

import _offline  # noqa: F401  (repository root on sys.path, offline)

from llm_gym.agent.templates import render_chat_template


def _tokenizer(model: str):
    if model == "tiny":
        from tests._tiny import build_tiny_tokenizer

        return build_tiny_tokenizer(), "tests' tiny ChatML tokenizer"
    from llm_gym.trainer.models import load_tokenizer

    return load_tokenizer(model), model


def chats() -> dict[str, list[dict[str, str]]]:
    board = "#####\n#_P_#\n#_X_#\n#_O_#\n#####\n" * 2
    conv = [{"role": "system", "content": "You are solving Sokoban. " * 20}]
    for _ in range(20):
        conv.append({"role": "user", "content": board})
        conv.append({"role": "assistant", "content": "<think>push the box down</think><answer>Down</answer>"})
    return {
        "probe (2 messages)": conv[:1] + [{"role": "user", "content": "U"}],
        "conversation (41 messages)": conv,
    }


def measure(tok, messages, rounds: int, per_round: int) -> tuple[float, float]:
    """Median seconds per render: (reference, guarded)."""

    def reference():
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def guarded():
        return render_chat_template(tok, messages, add_generation_prompt=True)

    assert reference() == guarded()  # the same text
    sides: dict[str, list[float]] = {"reference": [], "guarded": []}
    for r in range(rounds):
        order = (("reference", reference), ("guarded", guarded))
        for name, fn in order if r % 2 == 0 else order[::-1]:
            start = time.process_time()  # CPU time: less sensitive to other processes on a shared machine
            for _ in range(per_round):
                fn()
            sides[name].append((time.process_time() - start) / per_round)
    return statistics.median(sides["reference"]), statistics.median(sides["guarded"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few renders only (smoke test)")
    parser.add_argument("--model", default="smollm2", help="tokenizer to render with (or 'tiny')")
    args = parser.parse_args(argv)
    try:
        tok, name = _tokenizer(args.model)
    except Exception as e:  # noqa: BLE001 - no offline SmolLM2 here: the tiny tokenizer still measures the guard
        print(f"({args.model} unavailable: {type(e).__name__}; using the tiny tokenizer)")
        tok, name = _tokenizer("tiny")
    rounds, per_round = (3, 5) if args.quick else (21, 200)
    print(f"tokenizer: {name}; {rounds} alternating rounds of {per_round} renders per side")
    print(f"{'chat':<28} {'apply_chat_template':>20} {'render_chat_template':>21} {'ratio':>7}")
    for label, messages in chats().items():
        ref, guarded = measure(tok, messages, rounds, per_round)
        print(f"{label:<28} {ref * 1e6:>17.1f} us {guarded * 1e6:>18.1f} us {guarded / ref:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
