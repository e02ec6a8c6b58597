"""The chat-template deadline under attack: renders that end just as their deadline fires, several threads, and a
template operation that the deadline cannot interrupt (``llm_gym.agent.templates``)."""

from __future__ import annotations

import threading
import time

import pytest

from llm_gym.agent.templates import (
    TemplateRenderError,
    render_chat_template,
    uninterruptible,
)

MSGS = [{"role": "user", "content": "hi"}]


class _Busy:
    """A tokenizer whose render runs Python code for ``seconds`` (or until ``stop`` is set), then returns text."""

    def __init__(self, seconds: float, stop: threading.Event | None = None):
        self.seconds, self.stop = seconds, stop

    def apply_chat_template(self, messages, **kwargs):
        start = time.perf_counter()
        while time.perf_counter() - start < self.seconds and not (self.stop and self.stop.is_set()):
            pass
        return "text"


def _looping_render_ends(timeout: float = 5.0) -> bool:
    """Whether a render that never ends by itself, started in another thread with a 0.2 s deadline, is stopped."""
    stop, result = threading.Event(), []

    def run():
        try:
            render_chat_template(_Busy(3600, stop), MSGS, add_generation_prompt=True, deadline_s=0.2)
        except TemplateRenderError as e:
            result.append(e.timed_out)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    stop.set()  # a dead watchdog leaves the render spinning: end it so the test run goes on
    thread.join(timeout)
    return result == [True]


def test_renders_ending_as_their_deadline_fires_leave_the_deadline_working():
    # A render that ended while the watchdog was firing at it waited for the watchdog's lock and got the exception
    # right after taking it: the lock stayed held, the watchdog never ran again (no later render had a deadline)
    # and other threads' renders hung. Each render here lasts exactly its deadline.
    outcomes = {"rendered": 0, "timed out": 0}
    for i in range(300):
        seconds = 0.001 * (1 + i % 4)
        busy = 2 * seconds + 0.005 if i % 4 == 3 else seconds  # and some that surely time out
        try:
            render_chat_template(_Busy(busy), MSGS, add_generation_prompt=True, deadline_s=seconds)
            outcomes["rendered"] += 1
        except TemplateRenderError as e:
            assert e.timed_out
            outcomes["timed out"] += 1
        # an exception fired for the render never lands after it returned
        total = 0
        for k in range(2_000):
            total += k
    assert outcomes["timed out"] > 0, outcomes  # the firing path was exercised
    assert _looping_render_ends(), "the watchdog no longer stops renders"


def test_threads_get_their_own_deadlines_and_no_stray_exceptions():
    results: dict[int, list] = {}

    def worker(k: int) -> None:
        out: list = []
        try:
            for _ in range(3):
                if k % 2:  # loops: stopped at its own deadline
                    try:
                        render_chat_template(
                            _Busy(20), MSGS, add_generation_prompt=True, deadline_s=0.1 + 0.05 * k
                        )
                        out.append("rendered")
                    except TemplateRenderError as e:
                        out.append("timed out" if e.timed_out else str(e))
                else:  # quick renders in the same process are never hit by another thread's deadline
                    for _ in range(100):
                        render_chat_template(_Busy(0), MSGS, add_generation_prompt=True, deadline_s=5)
                    out.append("rendered")
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:
                pass
        except BaseException as e:  # noqa: BLE001 - a deadline that landed in the wrong place
            out.append(f"stray {type(e).__name__}")
        results[k] = out

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {k: ["timed out" if k % 2 else "rendered"] * 3 for k in range(6)}


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("{{ 7 ** 999999999 }}", True),
        ("{% set x = 2 %}{{ (x)**(x) }}", True),
        ("{% if true %}{{ 10**9 }}{% endif %}", True),
        ("**bold** markdown {{ '**' }} {{ 2 * 3 }}", False),  # text and strings are not the operator
        ("{% raw %}{{ 2 ** 3 }}{% endraw %}", False),
        ("{{ unclosed", False),  # a syntax error is transformers' to report
    ],
)
def test_the_power_operator_is_found_by_the_lexer(source, found):
    assert (uninterruptible(source) is not None) is found


def test_a_power_template_is_refused_unrendered(tmp_path):
    pytest.importorskip("transformers")
    from llm_gym.trainer.chat_templates import check_template, training_template_tokens

    from tests._tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = "{{ 7 ** 999999999 }}"  # compiling alone took hours: Jinja folds the constant
    start = time.perf_counter()
    with pytest.raises(TemplateRenderError, match="power operator") as info:
        render_chat_template(tok, MSGS, add_generation_prompt=True)
    assert info.value.refused and info.value.rendering_again_may_hang
    check = check_template(tok)  # no TRL variant check either: TRL would render (compile) it
    assert not check.ok and "power operator" in check.lines()[-1]
    with pytest.raises(TemplateRenderError, match="power operator"):
        training_template_tokens(tok)
    with pytest.raises(TemplateRenderError, match="power operator"):  # passed as --chat_template text
        render_chat_template(
            build_tiny_tokenizer(), MSGS, add_generation_prompt=True, chat_template="{{ 2 ** 99999999 }}"
        )
    assert time.perf_counter() - start < 10
