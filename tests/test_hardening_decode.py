"""The env judges exactly the text of the sampled tokens (issue 16, item 16)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_gym.trainer.chat_templates import ChatTemplateTokens  # noqa: E402
from llm_gym.trainer.rollouts import play_token_episodes  # noqa: E402

from tests._tiny import build_tiny_tokenizer  # noqa: E402

LAKE = "llmgym/FrozenLakeDeterministic-v0"


class Scripted:
    """Returns fixed token ids for every row."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def __call__(self, contexts, budgets):
        return [list(self.ids) for _ in contexts], [[0.0] * len(self.ids) for _ in contexts]


@pytest.fixture(scope="module")
def template():
    return ChatTemplateTokens(build_tiny_tokenizer("chatml"))


def _play(template, ids):
    (episode,) = play_token_episodes(
        LAKE,
        [0],
        Scripted(ids),
        template,
        max_new_tokens=64,
        max_completion_length=400,
        env_kwargs={"max_turns": 1},
    )
    return episode.record.turns[0]


def test_special_token_inside_the_answer_makes_it_invalid(template):
    tok = template.tokenizer
    special = tok.convert_tokens_to_ids("<|endoftext|>")
    assert special not in template.stop_ids
    ids = template.encode("<think>go</think><answer>Le") + [special] + template.encode("ft</answer>")
    turn = _play(template, ids + [template.end_of_turn_id])
    # skip_special_tokens=True used to hand the env "...Left</answer>", a valid move the tokens never said
    assert turn.response == "<think>go</think><answer>Le<|endoftext|>ft</answer>"
    assert turn.info["action_is_valid"] is False and turn.actions == []


def test_the_ending_stop_token_is_not_part_of_the_reply(template):
    ids = template.encode("<think>go</think><answer>Left</answer>")
    for tail in ([template.end_of_turn_id], []):  # ended by end-of-turn, or cut by the token budget
        turn = _play(template, ids + tail)
        assert turn.response == "<think>go</think><answer>Left</answer>"
        assert turn.info["action_is_valid"] is True and turn.actions == ["Left"]
