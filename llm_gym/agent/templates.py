"""Rendering a model's chat template, which is untrusted input like a data file.

A chat template is Jinja code shipped in a model folder (``chat_template.jinja``, ``tokenizer_config.json``) or
passed with ``--chat_template``. Transformers renders it in Jinja's ``ImmutableSandboxedEnvironment``: no
attribute of Python internals (``''.__class__`` raises ``SecurityError``), no file or module access, ``range``
capped at 100,000 items. What the sandbox does not bound is time: two nested ``range(100000)`` loops run for
hours. Every render of llm-gym therefore goes through :func:`render_chat_template`, which adds

- a **deadline** (:data:`TEMPLATE_DEADLINE_S` seconds): a watchdog thread raises an exception inside the
  rendering thread when it passes (``PyThreadState_SetAsyncExc``: delivered between two Python bytecodes, so
  a compiled template's loops are interrupted; one long C-level operation such as ``'x' * 10**9`` finishes
  first). One watchdog thread serves every render; arming it costs a dict entry (no lock, no thread);
- a **refusal** of the one such C-level operation that is cheap to write and never needed in a chat template:
  the power operator (:func:`uninterruptible`; ``{{ 7 ** 999999999 }}`` runs for hours);
- a **size bound** on the text a template renders (:func:`max_rendered_chars`), counted **while it renders**:
  Jinja joins a template's output (and each macro's and ``{% set %}`` block's) with its environment's
  ``concat``; for the sandboxed environment transformers renders in, that join counts the pieces as the
  template yields them and stops at the bound (:func:`_bounded_concat`, active only inside
  :func:`render_chat_template`), so a loop emitting text fails at about the bound instead of filling memory
  until the deadline;
- **one error type**: whatever the template raises (its own ``raise_exception('System role not supported')``,
  ``UndefinedError``, ``SecurityError``, ``ZeroDivisionError``, ``RecursionError``, ``MemoryError``, ...)
  becomes a :class:`ChatTemplateError` (a ``ValueError``) saying what the template did, which the commands print
  as one line (``llmgym check-template`` as its verdict).

Files are bounded where they are read (``llm_gym.trainer.models``: template files at most 1 MiB, tokenizer
files at most 64 MiB).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

#: Longest a single render may take (seconds). A normal render takes well under a millisecond (a 40-turn
#: conversation: about 1 ms); the deadline only stops a template that loops.
TEMPLATE_DEADLINE_S = 10.0


_POLL_S = 1.0


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used (it raised, looped or rendered nonsense); the message says
    why. (Also raised by token-level multi-turn rollouts for templates that rewrite history.)"""


class TemplateRenderError(ChatTemplateError):
    """The template failed to render at all: it raised, did not finish within the deadline (``timed_out``), or
    rendered far more text than its messages (as opposed to rendering text that token-level training cannot
    use)."""

    def __init__(self, message: str, *, timed_out: bool = False, refused: bool = False):
        super().__init__(message)
        self.timed_out = timed_out
        #: Refused unrendered: it holds an operation the deadline cannot interrupt (:func:`uninterruptible`).
        self.refused = refused

    @property
    def rendering_again_may_hang(self) -> bool:
        """Whether rendering this template again (TRL's training-variant check does) could hang: it timed out, or
        was refused for an operation that cannot be interrupted."""
        return self.timed_out or self.refused


class _TooLarge(Exception):
    """Raised inside a render when its output passes the bound (:func:`_bounded_concat`)."""

    def __init__(self, chars: int):
        super().__init__(chars)
        self.chars = chars


#: The messages of this thread's render in progress (None outside :func:`render_chat_template`): their
#: :func:`max_rendered_chars` bounds its text, worked out only once the text passes the first million characters.
_BOUND = threading.local()
_FLOOR = 1_000_000


def _bounded_concat(pieces: Any) -> str:
    """Jinja's ``concat`` (``"".join``), counting the pieces as they come while a render of ours is in progress."""
    messages = getattr(_BOUND, "messages", None)
    if messages is None:
        return "".join(pieces)
    out: list[str] = []
    append, n, limit = out.append, 0, _FLOOR
    for piece in pieces:  # str pieces (Jinja yields str() of every value), as "".join needs
        n += len(piece)
        if n > limit:
            if limit == _FLOOR and (limit := max_rendered_chars(messages)) >= n:
                append(piece)
                continue
            raise _TooLarge(n)
        append(piece)
    return "".join(out)


@functools.cache
def _bound_sandbox_output() -> None:
    """Make the sandboxed environment's ``concat`` :func:`_bounded_concat` (once; a no-op outside our renders)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    ImmutableSandboxedEnvironment.concat = staticmethod(_bounded_concat)


class TemplateDeadline(BaseException):
    """Raised inside the rendering thread when the deadline passes. A ``BaseException``, so that no ``except
    Exception`` in the template engine swallows it."""


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> bool:
    try:
        import ctypes

        n = ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
        )
    except (ImportError, AttributeError):  # pragma: no cover - not CPython: no deadline
        return False
    return n == 1


class _Watchdog:
    """One daemon thread that raises :class:`TemplateDeadline` in threads whose deadline passed.

    A rendering thread never takes a lock here. The exception can land at any bytecode boundary of the rendering
    thread, the moment right after a lock acquisition included: a render that ended just as its deadline fired,
    and then waited in ``disarm`` for a lock the watchdog held while firing, got the exception inside
    ``Condition.__enter__`` with the lock taken, so the watchdog blocked for ever (no later render had a
    deadline) and every other thread's next render hung in ``arm``. Instead, a token is handed over through
    ``dict.pop``, which is atomic: whoever pops it (``disarm`` at the end of the render, or the watchdog at the
    deadline) owns it, and the watchdog wakes early through a lock that renders only *release*."""

    def __init__(self) -> None:
        self._due: dict[int, tuple[float, int]] = {}  # token -> (monotonic deadline, thread id)
        self._fired: set[int] = set()  # tokens whose exception the watchdog has set
        self._tokens = itertools.count(1)
        self._start = threading.Lock()  # only for starting the thread (no deadline is armed in a thread then)
        self._wake = (
            threading.Lock()
        )  # held by the watchdog while it sleeps; arm() releases it to wake it early
        self._owner: int | None = None  # the pid whose thread runs (a forked child starts its own)
        self._wake_at = 0.0  # when the thread wakes next: an earlier deadline must wake it

    def _ensure_thread(self) -> None:
        if self._owner == os.getpid():
            return
        with self._start:
            if self._owner != os.getpid():
                self._wake = threading.Lock()
                self._wake.acquire()
                threading.Thread(
                    target=self._run, args=(self._wake,), name="llm-gym template deadline", daemon=True
                ).start()
                self._owner = os.getpid()

    def after_fork(self) -> None:
        """In a forked child: the parent's thread is gone and its locks may have been held; start afresh."""
        self._start = threading.Lock()
        self._due.clear()
        self._fired.clear()
        self._owner = None
        self._wake_at = 0.0

    def arm(self, seconds: float) -> int:
        self._ensure_thread()
        token = next(self._tokens)
        due = time.monotonic() + seconds
        self._due[token] = (due, threading.get_ident())
        if due < self._wake_at:  # rare (short deadlines): waking the thread on every render would cost more
            with contextlib.suppress(RuntimeError):  # already released: the thread is about to run anyway
                self._wake.release()
        return token

    def disarm(self, token: int) -> None:
        if self._due.pop(token, None) is not None:
            return  # the render ended first: the watchdog never fires a token it did not pop
        # The watchdog popped it: its exception is set, or about to be. Wait until it is set, then withdraw it
        # if it has not landed yet (if it lands during the wait, it propagates from here: no lock is held).
        while token not in self._fired:
            time.sleep(0.0002)
        self._fired.discard(token)
        _set_async_exc(threading.get_ident(), None)

    def _earliest(self, now: float) -> float:
        return min([d for d, _ in list(self._due.values())] + [now + _POLL_S])

    def _run(self, wake: threading.Lock) -> None:
        while True:
            now = time.monotonic()
            for token, (deadline, thread_id) in list(self._due.items()):
                if deadline <= now and self._due.pop(token, None) is not None:
                    _set_async_exc(thread_id, TemplateDeadline)
                    self._fired.add(token)
            # sleep until the earliest deadline, and at most a second, so a render armed meanwhile with a
            # deadline of a second or more needs no wake-up call; a render armed between the two reads below
            # sees the new wake-up time (and wakes the thread) or is seen by the second read
            self._wake_at = self._earliest(now)
            self._wake_at = min(self._wake_at, self._earliest(now))
            wake.acquire(timeout=max(self._wake_at - time.monotonic(), 0.0))


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG.after_fork)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`TemplateDeadline` in this thread if the block runs longer than ``seconds``."""
    token = _WATCHDOG.arm(seconds)
    try:
        yield
    finally:
        _WATCHDOG.disarm(token)


def _text_size(messages: Any) -> int:
    total = 0
    for m in messages if isinstance(messages, list) else []:
        if isinstance(m, dict):
            total += sum(len(v) for v in m.values() if isinstance(v, str))
    return total


def max_rendered_chars(messages: Any) -> int:
    """The most text a template may render for ``messages``: 1,000,000 characters of markup plus ten times the
    messages' own text (role headers and special tokens are a few dozen characters per message)."""
    return 1_000_000 + 10 * _text_size(messages)


def render_chat_template(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    chat_template: str | None = None,
    deadline_s: float | None = None,
) -> str:
    """``tokenizer.apply_chat_template(messages, tokenize=False, ...)`` with a deadline and a size bound; any
    failure of the template is a :class:`ChatTemplateError` naming what it raised."""
    seconds = TEMPLATE_DEADLINE_S if deadline_s is None else deadline_s
    _refuse_uninterruptible(tokenizer, chat_template)
    _bound_sandbox_output()
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    try:
        token = _WATCHDOG.arm(seconds)
        _BOUND.messages = messages
        try:
            text = tokenizer.apply_chat_template(messages, **kwargs)
        finally:
            _BOUND.messages = None
            _WATCHDOG.disarm(token)
    except _TooLarge:
        raise TemplateRenderError(
            f"the chat template rendered more than {max_rendered_chars(messages):,} characters for "
            f"{_text_size(messages):,} characters of messages (stopped while rendering)"
        ) from None
    except TemplateDeadline:
        raise TemplateRenderError(
            f"the chat template did not finish rendering within {seconds:g} s (a loop that does not end?)",
            timed_out=True,
        ) from None
    except Exception as e:  # noqa: BLE001 - the template is untrusted code: whatever it raises is its failure
        raise TemplateRenderError(f"the chat template raised {type(e).__name__}: {_short(e)}") from None
    if not isinstance(text, str):
        raise TemplateRenderError(f"the chat template rendered a {type(text).__name__}, not text")
    if len(text) > _FLOOR and len(text) > (limit := max_rendered_chars(messages)):  # a render not counted
        raise TemplateRenderError(
            f"the chat template rendered {len(text):,} characters for {_text_size(messages):,} characters of "
            f"messages (at most {limit:,})"
        )
    return text


@functools.lru_cache(maxsize=8)
def uninterruptible(source: str) -> str | None:
    """What in template ``source`` the deadline cannot stop, or None. The deadline interrupts a template between two
    Python bytecodes; one operation in C runs to its end first. The power operator is the one such operation that
    chat templates never need and that costs hours for a few characters: ``{{ 7 ** 999999999 }}`` computes a
    350-million-bit integer (Jinja even folds it while compiling), about 30 s for ``7 ** 16000000`` alone."""
    from jinja2 import Environment
    from jinja2.exceptions import TemplateSyntaxError

    try:
        if any(kind == "operator" and value == "**" for _, kind, value in Environment().lex(source)):
            return "the power operator `**`"
    except TemplateSyntaxError:  # transformers reports it when it compiles the template
        return None
    return None


def _refuse_uninterruptible(tokenizer: Any, chat_template: str | None) -> None:
    get = getattr(tokenizer, "get_chat_template", None)
    try:
        source = get(chat_template) if get is not None else chat_template
    except Exception:  # noqa: BLE001 - no template, or an unknown name: apply_chat_template says so
        return
    if isinstance(source, str) and (what := uninterruptible(source)) is not None:
        raise TemplateRenderError(
            f"the chat template uses {what}, which can run for hours in one step that the {TEMPLATE_DEADLINE_S:g} s "
            "deadline cannot interrupt; refused unrendered",
            refused=True,
        )


def _short(e: BaseException, limit: int = 300) -> str:
    try:
        text = " ".join(str(e).split())
    except Exception:  # noqa: BLE001 - an exception whose str() fails
        text = ""
    text = text or "(no message)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "TEMPLATE_DEADLINE_S",
    "ChatTemplateError",
    "TemplateDeadline",
    "TemplateRenderError",
    "deadline",
    "max_rendered_chars",
    "render_chat_template",
    "uninterruptible",
]
