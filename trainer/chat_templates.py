"""Chat templates for token-exact multi-turn training: check one, and swap in TRL's training variant if needed.

Our rollouts never re-tokenise the history: the tokens between two model turns are the *difference* between the
template rendered with ``k`` and ``k + 1`` turns (:class:`ChatTemplateTokens`, used by :mod:`llm_gym.trainer.rollouts`). That
needs a template that leaves earlier text unchanged when a turn is added. Thinking templates such as Qwen3's
drop the reasoning of earlier assistant turns once a new user turn follows, so they fail that check.

TRL 1.16 ships *training variants* of such templates (``trl/chat_templates/*_training.jinja``, found by
``trl.chat_template_utils.get_training_chat_template``), which always render the reasoning. When the model's own
template fails, :func:`training_template_tokens` uses TRL's variant for the training and in-training evaluation
rollouts and says so in the log; only a template without a working variant stops training. The tokenizer itself
is left unchanged, so the saved model keeps its own template for inference (``llmgym-eval``).

``llmgym check-template MODEL`` prints :func:`check_template`'s report.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_gym.agent.templates import (
    TEMPLATE_DEADLINE_S,
    ChatTemplateError,
    TemplateDeadline,
    TemplateRenderError,
    deadline,
    render_chat_template,
)

logger = logging.getLogger(__name__)

_PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_SENTINEL = "XQZ_LLMGYM_SENTINEL_QZX"


# ----------------------------------------------------------------------------------------- template tokens
def _end_of_turn(tokenizer: Any, chat_template: str | None = None) -> tuple[int, str]:
    """The special token that closes an assistant message in the chat template, and the template text from it
    to the end of a rendered conversation (a probe chat ending in an assistant message)."""
    probe = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": _SENTINEL},
    ]
    # untrusted code: sandboxed, with a deadline; any failure is a ChatTemplateError
    full = render_chat_template(tokenizer, probe, add_generation_prompt=False, chat_template=chat_template)
    at = full.rfind(_SENTINEL)
    if at < 0:
        raise ChatTemplateError(
            "the chat template drops assistant message content; cannot build trajectories"
        )
    tail = full[at + len(_SENTINEL) :]
    tail_ids = list(tokenizer(tail, add_special_tokens=False)["input_ids"])
    if not tail_ids or tail_ids[0] not in set(tokenizer.all_special_ids):
        raise ChatTemplateError(
            f"cannot find the end-of-turn token after an assistant message (template renders {tail!r}); "
            "the template must close assistant turns with a special token such as <|im_end|> or <|eot_id|>"
        )
    return int(tail_ids[0]), tail


def template_stop_ids(tokenizer: Any, chat_template: str | None = None) -> list[int]:
    """Where generation stops, in training rollouts and in ``llmgym-eval`` alike: the template's end-of-turn
    token and the tokenizer's eos. A base model's tokenizer can have eos ``<|endoftext|>`` while its template
    closes turns with ``<|im_end|>`` (Qwen2.5 base): stopping at eos only would run past the end of the turn."""
    eot, _ = _end_of_turn(tokenizer, chat_template)
    eos = tokenizer.eos_token_id
    return sorted({eot, *([int(eos)] if eos is not None else [])})


class ChatTemplateTokens:
    """Token ids of prompts and of the template text between model turns, for one tokenizer.

    On construction it renders a probe conversation to find the end-of-turn token that closes an assistant
    message (``<|im_end|>``, ``<|eot_id|>``, ...) and the template text that follows it.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None):
        if not (chat_template or getattr(tokenizer, "chat_template", None)):
            raise ChatTemplateError(
                "the tokenizer has no chat template; multi-turn rollouts need one (use an instruct model or "
                "pass --chat_template FILE)"
            )
        self.tokenizer = tokenizer
        #: The template rendered (None: the tokenizer's own); e.g. TRL's training variant of a thinking template.
        self.chat_template = chat_template
        probe = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        prompt = self.render(probe, add_generation_prompt=True)
        full = self.render([*probe, {"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
        self.end_of_turn_id, tail = _end_of_turn(tokenizer, chat_template)
        self.end_of_turn_text: str = tokenizer.convert_ids_to_tokens(self.end_of_turn_id)
        #: Template text after the end-of-turn token of an assistant message (``"\n"`` for ChatML).
        self.after_turn_text: str = (
            tail[len(self.end_of_turn_text) :] if tail.startswith(self.end_of_turn_text) else ""
        )
        #: Whether the generation prompt is a plain prefix of a rendered assistant turn (informational).
        self.prefix_preserving: bool = full.startswith(prompt)
        self.stop_ids: list[int] = template_stop_ids(tokenizer, chat_template)
        # Fail now, not at turn 2 of the first rollout, if the template rewrites history between turns.
        self.between_turns_ids([*probe, {"role": "assistant", "content": _SENTINEL}], "U2")

    def render(self, messages: list[dict], *, add_generation_prompt: bool) -> str:
        return render_chat_template(
            self.tokenizer,
            messages,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def between_turns_ids(self, history: list[dict], next_user: str) -> list[int]:
        """Ids that follow the end-of-turn token of the last assistant message in ``history`` up to the next
        generation prompt: ``render(history + user, gen) - render(history)``, plus the text after end-of-turn."""
        before = self.render(history, add_generation_prompt=False)
        after = self.render([*history, {"role": "user", "content": next_user}], add_generation_prompt=True)
        if not after.startswith(before):
            k = next(
                (i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after))
            )
            raise ChatTemplateError(
                "the chat template is not prefix-preserving: adding the next turn changes earlier text at "
                f"character {k} ({before[k : k + 40]!r} -> {after[k : k + 40]!r}). Token-level multi-turn training "
                "needs a template that leaves history unchanged; pass --chat_template with one that does."
            )
        return self.encode(self.after_turn_text + after[len(before) :])


# ----------------------------------------------------------------------------------------- checks and variants


@functools.cache
def trl_known_templates() -> frozenset[str]:
    """The chat templates TRL has a training variant for: TRL recognises a template by its exact text, and ships
    each one it recognises as ``trl/chat_templates/NAME.jinja`` beside its ``NAME_training.jinja``."""
    try:
        import trl

        folder = Path(trl.__file__).parent / "chat_templates"
        return frozenset(
            (folder / f"{p.name[: -len('_training.jinja')]}.jinja").read_text(encoding="utf-8")
            for p in sorted(folder.glob("*_training.jinja"))
            if (folder / f"{p.name[: -len('_training.jinja')]}.jinja").is_file()
        )
    except (ImportError, OSError):  # pragma: no cover - TRL is a dependency of the trainer
        return frozenset()


def trl_training_template(tokenizer: Any) -> str | None:
    """TRL's training variant of the tokenizer's chat template, or None when TRL has none (or would not change
    it). Never raises for an unknown template: TRL recognises templates by their exact text.

    TRL's check renders and tokenises the template itself, outside :func:`render_chat_template`'s size bound
    (and a Rust tokenisation cannot be interrupted by the deadline): a template rendering 7 MB cost 4.2 GB there.
    So TRL is asked only about templates it ships (:func:`trl_known_templates`), whose text is TRL's own; any
    other template, for which TRL has no variant anyway, is never rendered outside the bounds."""
    current = getattr(tokenizer, "chat_template", None)
    if isinstance(current, dict):
        current = current.get("default")
    if not isinstance(current, str) or not current:
        return None
    if current not in trl_known_templates():
        logger.debug("no TRL training variant: TRL ships no such template")
        return None
    try:
        from trl.chat_template_utils import get_training_chat_template

        with deadline(TEMPLATE_DEADLINE_S):  # TRL renders the (untrusted) template to check it
            variant = get_training_chat_template(tokenizer)
    except ImportError:  # pragma: no cover - TRL is a dependency of the trainer
        return None
    except TemplateDeadline:
        logger.debug("no TRL training variant: the template did not finish rendering")
        return None
    except Exception as e:  # noqa: BLE001 - TRL raises ValueError for unknown templates; a template may fail to render
        logger.debug("no TRL training variant: %s", e)
        return None
    return variant if isinstance(variant, str) and variant != current else None


def variant_name(template: str) -> str:
    """The file name of a TRL training template (e.g. ``qwen3_training.jinja``), or a generic label."""
    try:
        import trl

        folder = Path(trl.__file__).parent / "chat_templates"
        for path in sorted(folder.glob("*_training.jinja")):
            if path.read_text(encoding="utf-8") == template:
                return f"TRL's {path.name}"
    except (ImportError, OSError):  # pragma: no cover
        pass
    return "TRL's training variant"


def training_template_tokens(tokenizer: Any, *, log: Any = None) -> ChatTemplateTokens:
    """The :class:`ChatTemplateTokens` used by training rollouts: the tokenizer's template when it works, else
    TRL's training variant of it (logged through ``log``, default a logger warning). Raises
    :class:`ChatTemplateError` when neither works, saying why and what to do."""
    try:
        return ChatTemplateTokens(tokenizer)
    except ChatTemplateError as original:
        if isinstance(original, TemplateRenderError) and original.rendering_again_may_hang:
            raise  # TRL would render the same template again (its variants are for known templates)
        variant = trl_training_template(tokenizer)
        if variant is None:
            raise ChatTemplateError(
                f"{original} TRL has no training variant of this template; `llmgym check-template MODEL` explains "
                "the checks"
            ) from None
        try:
            tokens = ChatTemplateTokens(tokenizer, chat_template=variant)
        except ChatTemplateError as e:
            raise ChatTemplateError(f"{original} {variant_name(variant)} does not work either: {e}") from None
        message = (
            f"the model's chat template cannot be used for token-exact multi-turn training ({original}); "
            f"training and in-training evaluation rollouts use {variant_name(variant)} instead (it renders "
            "earlier turns unchanged). The saved tokenizer keeps the model's own template."
        )
        (log or logger.warning)(message)
        return tokens


@dataclass
class TemplateCheck:
    """What :func:`check_template` found; ``ok`` means ``llmgym-train`` can train with it."""

    has_template: bool
    #: The template as is: adding a turn leaves earlier text unchanged (None: not checked).
    prefix_preserving: bool | None = None
    #: The generation prompt is a plain prefix of a rendered assistant turn (informational: handled either way).
    generation_prompt_prefix: bool | None = None
    end_of_turn: str | None = None
    #: Why the template as is cannot be used (None: it can).
    error: str | None = None
    #: Name of TRL's training variant, if TRL has one for this template.
    variant: str | None = None
    #: Why the variant cannot be used either (None: it can, or there is none).
    variant_error: str | None = None
    #: The template could not be rendered at all (it raised, looped, or rendered far too much); then ``error``
    #: holds the same text.
    render_error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def uses_variant(self) -> bool:
        return self.error is not None and self.variant is not None and self.variant_error is None

    @property
    def ok(self) -> bool:
        return self.has_template and (self.error is None or self.uses_variant)

    def lines(self) -> list[str]:
        """A human-readable report, one check per line, ending with the verdict."""

        def yn(value: bool | None) -> str:
            return "not checked" if value is None else ("yes" if value else "no")

        out = [f"chat template present: {yn(self.has_template)}"]
        if self.has_template:
            out.append(f"end-of-turn token after an assistant message: {self.end_of_turn or 'not found'}")
            out.append(
                "prefix-preserving (adding a turn leaves earlier text unchanged): "
                + yn(self.prefix_preserving)
                + (f" - {self.error}" if self.error else "")
            )
            out.append(
                "generation prompt is a prefix of the rendered assistant turn: "
                + yn(self.generation_prompt_prefix)
                + (
                    " (fine: the tokens between turns are taken as a difference)"
                    if self.generation_prompt_prefix is False
                    else ""
                )
            )
            if self.variant:
                if self.error is None:
                    status = "not needed: the model's own template works"
                else:
                    status = "works" if self.variant_error is None else f"does not work: {self.variant_error}"
                out.append(f"TRL training variant: {self.variant} ({status})")
            else:
                out.append("TRL training variant: none for this template")
        out.extend(self.notes)
        if not self.has_template:
            verdict = "NOT USABLE: no chat template (use an instruct model or pass --chat_template FILE)"
        elif self.render_error is not None and not self.uses_variant:
            verdict = (
                f"NOT USABLE: {self.render_error.replace('the chat template ', 'the template ', 1)} (rendering "
                "llm-gym's chat: a system message with the task, then user and assistant turns); pass "
                "--chat_template FILE with a template that renders it"
            )
        elif self.error is None:
            verdict = "OK: token-exact multi-turn training works with the model's own template"
        elif self.uses_variant:
            verdict = (
                f"OK with {self.variant}: llmgym-train swaps it in for training rollouts (and says so in the log); "
                "the saved tokenizer keeps the model's own template"
            )
        else:
            verdict = (
                "NOT USABLE for token-exact multi-turn training: pass --chat_template FILE with a template that "
                "leaves earlier turns unchanged"
            )
        out.append(f"verdict: {verdict}")
        return out


def _fill(check: TemplateCheck, tokens: ChatTemplateTokens) -> None:
    check.end_of_turn = tokens.end_of_turn_text
    check.generation_prompt_prefix = tokens.prefix_preserving


def check_template(tokenizer: Any) -> TemplateCheck:
    """Check the tokenizer's chat template for token-exact multi-turn training, and TRL's variant if it fails."""
    if not getattr(tokenizer, "chat_template", None):
        return TemplateCheck(has_template=False)
    check = TemplateCheck(has_template=True)
    try:
        _fill(check, ChatTemplateTokens(tokenizer))
        check.prefix_preserving = True
    except ChatTemplateError as e:
        check.error = str(e)
        if isinstance(e, TemplateRenderError):
            check.render_error = str(e)
        check.prefix_preserving = False if "prefix-preserving" in check.error else None
        if check.end_of_turn is None and check.render_error is None:
            _probe_details(check, tokenizer)
        if isinstance(e, TemplateRenderError) and e.rendering_again_may_hang:
            return check  # TRL would render the same template again (its variants are for known templates)
    variant = trl_training_template(tokenizer)
    if variant is not None:
        check.variant = variant_name(variant)
        if check.error is not None:
            try:
                ChatTemplateTokens(tokenizer, chat_template=variant)
            except ChatTemplateError as e:
                check.variant_error = str(e)
    return check


def _probe_details(check: TemplateCheck, tokenizer: Any) -> None:
    """Best-effort end-of-turn token and generation-prompt check for a template that failed the full check."""
    try:
        prompt = render_chat_template(tokenizer, _PROBE, add_generation_prompt=True)
        full = render_chat_template(
            tokenizer, [*_PROBE, {"role": "assistant", "content": "A"}], add_generation_prompt=False
        )
    except ChatTemplateError:  # a broken template: the error already says why
        return
    check.generation_prompt_prefix = full.startswith(prompt)
    tail = full[full.rfind("A") + 1 :]
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
    if ids and ids[0] in set(tokenizer.all_special_ids):
        check.end_of_turn = tokenizer.convert_ids_to_tokens(ids[0])


__all__ = [
    "ChatTemplateError",
    "ChatTemplateTokens",
    "TemplateCheck",
    "check_template",
    "template_stop_ids",
    "training_template_tokens",
    "trl_known_templates",
    "trl_training_template",
    "variant_name",
]
