import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gym.core import format_response, parse_response


def test_think_and_answer():
    r = parse_response("<think>go left</think><answer>Left || Up</answer>")
    assert r.ok and r.think == "go left" and r.actions == ("Left", "Up") and r.error is None


def test_chatter_whitespace_and_case_are_tolerated():
    text = "Sure!\n <THINK>\n hmm \n</Think>  blah <Answer>  left ||  || UP  </ANSWER> thanks"
    r = parse_response(text)
    assert r.ok and r.actions == ("left", "UP") and r.think == "hmm"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "missing <think>"),
        ("<think>x</think>", "missing <answer>"),
        ("<answer>Left</answer>", "missing <think>"),
        ("<think>x</think><answer>  ||  </answer>", "empty answer"),
        ("<think>x<answer>Left</answer>", "missing <think>"),
        ("<answer>Left</answer><think>x</think>", "missing <answer>"),
    ],
)
def test_malformed(text, reason):
    r = parse_response(text)
    assert not r.ok and reason in r.error and r.actions == ()


def test_answer_only_mode_and_cap():
    r = parse_response("<answer>a || b || c</answer>", think=False, max_actions=2)
    assert r.ok and r.actions == ("a", "b") and r.dropped == 1


def test_no_separator_keeps_whole_answer():
    r = parse_response("<think></think><answer> 3 || 4 </answer>", sep=None)
    assert r.actions == ("3 || 4",)


def test_first_answer_block_wins():
    r = parse_response("<think>a</think><answer>Up</answer><answer>Down</answer>")
    assert r.actions == ("Up",)


def test_non_string_is_a_format_error():
    assert not parse_response(None).ok  # type: ignore[arg-type]
    assert not parse_response(b"<answer>x</answer>", think=False).ok  # type: ignore[arg-type]


@given(
    st.lists(st.text(alphabet=st.characters(blacklist_characters="|<>"), min_size=1), min_size=1, max_size=5)
)
def test_format_then_parse_roundtrip(actions):
    actions = [a.strip() for a in actions if a.strip()]
    if not actions:
        return
    r = parse_response(format_response(actions, "why"))
    assert r.ok and list(r.actions) == actions


@settings(max_examples=300)
@given(st.text(), st.booleans(), st.integers(min_value=1, max_value=5))
def test_parse_never_raises(text, think, cap):
    r = parse_response(text, think=think, max_actions=cap)
    assert r.ok == (r.error is None)
    assert len(r.actions) <= cap


def test_parse_is_linear_on_pathological_input():
    import time

    text = "<think>" * 20000 + "<answer>" * 20000
    t = time.perf_counter()
    r = parse_response(text)
    assert not r.ok and time.perf_counter() - t < 0.5


def test_case_folding_does_not_shift_indices():
    # "İ".lower() is two characters; the parser must still cut the answer at the right place.
    r = parse_response("İİİ<think>İ</think><ANSWER>Up</ANSWER>")
    assert r.ok and r.actions == ("Up",) and r.think == "İ"
