"""Text policies for evaluation: a batch of chats in, one reply per chat out (``llm_gym.agent.rollout.Policy``).

- :class:`HFPolicy`: a local transformers model; all chats of a turn go through one left-padded ``generate``.
- :class:`OpenAIPolicy`: any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, llama.cpp, TGI, ...)
  through the ``openai`` SDK (the ``openai`` extra) with a total deadline per request, a reply-size cap and no
  cross-origin requests; :meth:`OpenAIPolicy.probe` checks the endpoint and model before any episode runs.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import socket
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from llm_gym.trainer.defaults import EVAL_TEMPERATURE, EVAL_TOP_P, MAX_NEW_TOKENS

from llm_gym.core.checks import is_int


class EndpointError(ValueError):
    """An OpenAI-compatible endpoint that cannot be used; the message says what to check."""


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings shared by every policy (RAGEN-2 evaluates with T = 0.5 sampling)."""

    temperature: float = EVAL_TEMPERATURE
    top_p: float = EVAL_TOP_P
    max_new_tokens: int = MAX_NEW_TOKENS

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and 0.0 <= self.temperature <= 10.0):
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.max_new_tokens, numpy=False) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")


class HFPolicy:
    """A transformers causal LM as a batched policy.

    Every call renders the chats with the tokenizer's chat template, left-pads them into one batch (split into
    chunks of ``batch_size`` if set) and runs a single ``generate`` per chunk. ``temperature=0`` is greedy.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        sampling: SamplingParams | None = None,
        *,
        batch_size: int | None = None,
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; evaluation needs a chat (instruct) model")
        if batch_size is not None and (not is_int(batch_size, numpy=False) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.batch_size = batch_size
        self.generated_tokens = 0  # running count, for throughput reports
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        from llm_gym.trainer.chat_templates import template_stop_ids

        # the stop tokens of training rollouts: the template's end-of-turn token and eos
        self._eos = template_stop_ids(tokenizer)
        model.eval()

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        sampling: SamplingParams | None = None,
        *,
        batch_size: int | None = None,
        device: str | None = None,
        dtype: str | None = "auto",
    ) -> HFPolicy:
        """Load a hub id, a local folder or the offline alias ``smollm2`` (checked before any weights load)."""
        from llm_gym.trainer.models import check_model, load_model_and_tokenizer

        check_model(name_or_path)
        model, tok = load_model_and_tokenizer(name_or_path, dtype=dtype)
        if device:
            model = model.to(device)
        return cls(model, tok, sampling, batch_size=batch_size)

    @property
    def stop_ids(self) -> list[int]:
        """Token ids that end a reply (the same as training's, ``chat_templates.template_stop_ids``)."""
        return list(self._eos)

    def __call__(self, batch: list[list[dict]], generation_prefix: str = "") -> list[str]:
        """One reply per chat: the text generated after the generation prompt and ``generation_prefix``
        (the prefix itself is not repeated; :func:`llm_gym.agent.rollout` puts it in front)."""
        if not batch:
            return []
        step = self.batch_size or len(batch)
        out: list[str] = []
        for start in range(0, len(batch), step):
            out.extend(self._generate(batch[start : start + step], generation_prefix))
        return out

    def _generate(self, chats: list[list[dict]], generation_prefix: str = "") -> list[str]:
        import torch
        from transformers import GenerationConfig

        from llm_gym.agent.chat import generation_prompt

        texts = [generation_prompt(self.tokenizer, c, generation_prefix) for c in chats]
        # The template already holds any BOS / special tokens.
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        device = next(self.model.parameters()).device
        enc = {k: v.to(device) for k, v in enc.items()}
        s = self.sampling
        gen = GenerationConfig(
            max_new_tokens=s.max_new_tokens,
            do_sample=s.temperature > 0,
            temperature=s.temperature if s.temperature > 0 else None,
            top_p=s.top_p if s.temperature > 0 else None,
            top_k=None,
            eos_token_id=self._eos or None,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=None,
        )
        with torch.no_grad():
            seqs = self.model.generate(**enc, generation_config=gen)
        new = seqs[:, enc["input_ids"].shape[1] :]
        lengths = []
        for row in new.tolist():
            n = len(row)
            for i, t in enumerate(row):  # everything after the first EOS is padding
                if t in self._eos:
                    n = i + 1
                    break
            lengths.append(n)
        self.generated_tokens += sum(lengths)
        # Exactly the sampled text: only the end-of-sequence token that ends a reply is left out; special tokens
        # inside it stay (skipping them would show the env text the model never produced).
        return [
            self.tokenizer.decode(
                row[: n - 1] if n and row[n - 1] in self._eos else row[:n],
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
            )
            for row, n in zip(new.tolist(), lengths)
        ]


# ------------------------------------------------------------------------------------------------ endpoint
#: Largest reply body accepted from an endpoint; a chat completion of a few thousand tokens is a few KB.
DEFAULT_MAX_REPLY_BYTES = 8 * 2**20
#: A server's Retry-After is honoured up to this many seconds; longer waits fall back to exponential backoff.
MAX_RETRY_AFTER_S = 8.0
_OPENAI_MISSING = "endpoint evaluation needs the openai SDK: pip install 'llm-gym[openai]'"
#: Marks a reply the transport refused (too large, compressed, another origin). Refusals travel as HTTP 502
#: replies with ``x-should-retry: false`` because every SDK version obeys that; older ones retry exceptions.
_REFUSED = "x-llmgym-refused"


class _Refused(Exception):
    pass


def _http_module() -> Any:
    """The HTTP library the installed openai SDK is built on (``httpx`` for openai 1.x, ``httpx2`` later)."""
    try:
        import openai
    except ImportError:
        raise EndpointError(_OPENAI_MISSING) from None
    for base in openai.DefaultHttpxClient.__mro__[1:]:
        if base.__name__ == "Client":
            return importlib.import_module(base.__module__.partition(".")[0])
    import httpx

    return httpx


def _origin(url: Any) -> tuple[str, str, int | None]:
    return (url.scheme, url.host, url.port)


def _bounded_transport(
    httpx: Any, origin: tuple, deadline_s: float, max_bytes: int, concurrency: int, send_auth: bool
) -> Any:
    """An httpx transport that enforces what the SDK leaves to the caller.

    - a total deadline per HTTP request (connect, headers and body together): httpx timeouts are per read, so
      a server trickling one byte a second would never time out. A timer shuts the socket down at the
      deadline, which wakes the blocked read; the request then fails as ``ReadTimeout`` (retried by the SDK);
    - requests only to the endpoint's origin, so the API key never leaves it (redirects are not followed
      either; this is the second lock);
    - reply bodies of at most ``max_bytes``, uncompressed (a gzip bomb would pass a size cap);
    - a server's Retry-After honoured only up to :data:`MAX_RETRY_AFTER_S`;
    - no Authorization header when there is no key (the SDK insists on one, a local server needs none).

    A refusal is answered with a local HTTP 502 that the SDK does not retry (see ``_REFUSED``).

    Connections are not kept alive, so each request owns the socket the timer may shut down.
    """

    class BoundedTransport(httpx.BaseTransport):
        def __init__(self) -> None:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
            self._inner = httpx.HTTPTransport(limits=limits)

        def handle_request(self, request: Any) -> Any:
            try:
                return self._handle(request)
            except _Refused as e:
                reason = str(e)
                return httpx.Response(
                    502,
                    headers={"x-should-retry": "false", _REFUSED: reason, "content-type": "application/json"},
                    content=json.dumps({"error": {"message": reason}}).encode(),
                    request=request,
                )

        def _handle(self, request: Any) -> Any:
            if _origin(request.url) != origin:  # never send the API key to another host
                raise _Refused(
                    f"refusing a request to {request.url.scheme}://{request.url.host}: not the endpoint's origin"
                )
            timeouts = dict(request.extensions.get("timeout") or {})
            for phase in ("connect", "read", "write", "pool"):
                t = timeouts.get(phase)
                timeouts[phase] = deadline_s if t is None else min(t, deadline_s)
            request.extensions["timeout"] = timeouts
            request.headers["Accept-Encoding"] = "identity"
            if not send_auth:
                request.headers.pop("Authorization", None)
            sockets: list = []
            expired = threading.Event()
            lock = threading.Lock()

            def shut() -> None:
                with lock:
                    expired.set()
                    for sock in sockets:
                        try:  # the plain-socket shutdown also wakes a TLS read; closing would not
                            socket.socket.shutdown(sock, socket.SHUT_RDWR)
                        except OSError:
                            pass

            def trace(name: str, info: dict) -> None:
                if name.endswith((".connect_tcp.complete", ".start_tls.complete")):
                    stream = info.get("return_value")
                    sock = stream.get_extra_info("socket") if stream is not None else None
                    if isinstance(sock, socket.socket):
                        with lock:
                            sockets.append(sock)
                        if expired.is_set():
                            shut()

            previous = request.extensions.get("trace")

            def chained(name: str, info: dict) -> None:
                trace(name, info)
                if previous is not None:
                    previous(name, info)

            request.extensions["trace"] = chained
            timer = threading.Timer(deadline_s, shut)
            timer.daemon = True
            timer.start()
            try:
                response = self._inner.handle_request(request)
                try:
                    body = self._read_capped(response)
                finally:
                    response.close()
            except httpx.TransportError:
                if expired.is_set():
                    raise httpx.ReadTimeout(
                        f"no complete reply within {deadline_s:g} s", request=request
                    ) from None
                raise
            finally:
                timer.cancel()
            if expired.is_set():  # the shutdown may have ended a close-delimited body early
                raise httpx.ReadTimeout(f"no complete reply within {deadline_s:g} s", request=request)
            headers = httpx.Headers(response.headers)
            headers.pop(_REFUSED, None)  # only this transport may say so
            for name in ("retry-after", "retry-after-ms"):
                value = headers.get(name)
                if value is not None:
                    try:
                        wait = float(value) / (1000.0 if name.endswith("ms") else 1.0)
                    except ValueError:
                        wait = math.inf  # an HTTP date or junk: use the SDK's own backoff
                    if not 0 <= wait <= MAX_RETRY_AFTER_S:
                        del headers[name]
            return httpx.Response(
                response.status_code,
                headers=headers,
                stream=httpx.ByteStream(body),
                extensions={k: v for k, v in response.extensions.items() if k != "network_stream"},
            )

        @staticmethod
        def _read_capped(response: Any) -> bytes:
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise _Refused(f"the endpoint sent a {ascii(encoding[:30])}-compressed reply; expected none")
            too_big = f"the endpoint's reply is larger than the {max_bytes:,}-byte limit"
            length = response.headers.get("content-length")
            if length is not None and length.strip().isdigit() and int(length) > max_bytes:
                raise _Refused(too_big)
            chunks, size = [], 0
            for chunk in response.iter_raw():
                size += len(chunk)
                if size > max_bytes:
                    raise _Refused(too_big)
                chunks.append(chunk)
            return b"".join(chunks)

        def close(self) -> None:
            self._inner.close()

    return BoundedTransport()


def _redactor(secret: str | None) -> Any:
    """Replace the key in a message, also as a server may echo it: in another letter case, percent-encoded
    (``urllib.parse.quote``)."""
    if not secret:
        return lambda text: text
    forms = {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)), re.IGNORECASE)

    def redact(text: str) -> str:
        return pattern.sub("***", text)

    return redact


class OpenAIPolicy:
    """A model served behind an OpenAI-compatible API (``POST {base_url}/chat/completions``), via the openai SDK.

    Chats of a turn are sent concurrently (``concurrency`` threads), each as one request. Transient failures
    (connection errors, broken or incomplete replies, timeouts, HTTP 408 / 409 / 429 / 5xx) are retried
    ``retries`` times with the SDK's exponential backoff (0.5 s doubling, at most 8 s, with jitter).
    ``timeout`` is a total deadline per HTTP request, however slowly the server sends; so one completion
    takes at most ``(retries + 1) * timeout`` plus the backoff waits. Replies over ``max_reply_bytes``,
    redirects, compressed or malformed replies raise :class:`EndpointError`. The API key (``api_key`` or
    ``$OPENAI_API_KEY``) goes only to the endpoint's origin and never into a repr, log line or error message.
    Needs the ``openai`` extra.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        sampling: SamplingParams | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        concurrency: int = 16,
        retries: int = 3,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ):
        parsed = urllib.parse.urlsplit(base_url if isinstance(base_url, str) else "")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise EndpointError("endpoint must be an http(s) URL such as http://localhost:8000/v1")
        if parsed.username is not None or parsed.password is not None or parsed.query or parsed.fragment:
            # Credentials in the URL would end up in records and messages: they belong in --api_key.
            raise EndpointError(
                "endpoint must be a plain http(s) base URL without user:password@, query or fragment; "
                "pass the key with --api_key or OPENAI_API_KEY"
            )
        if not model or not isinstance(model, str):
            raise EndpointError("--model must name the served model when --endpoint is given")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        for name, value, low in (
            ("concurrency", concurrency, 1),
            ("retries", retries, 0),
            ("max_reply_bytes", max_reply_bytes, 1),
        ):
            if not is_int(value, numpy=False) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        httpx = _http_module()
        import openai

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sampling = sampling or SamplingParams()
        self.timeout = float(timeout)
        self.concurrency = concurrency
        self.retries = retries
        self.max_reply_bytes = max_reply_bytes
        self.generated_tokens = 0
        self._tokens_lock = threading.Lock()
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._redact = _redactor(key)  # a closure: the key stays out of the policy's attributes
        url = httpx.URL(self.base_url)
        transport = _bounded_transport(
            httpx, _origin(url), self.timeout, max_reply_bytes, concurrency, send_auth=bool(key)
        )
        http_client = httpx.Client(
            transport=transport, follow_redirects=False, timeout=httpx.Timeout(self.timeout), trust_env=False
        )
        self._client = openai.OpenAI(
            base_url=self.base_url,
            api_key=key or "unused",  # not sent: the transport drops it
            max_retries=retries,
            timeout=self.timeout,
            http_client=http_client,
        )
        self._openai = openai
        self._httpx = httpx

    def __repr__(self) -> str:  # never the key
        return (
            f"OpenAIPolicy(base_url={self.base_url!r}, model={self.model!r}, timeout={self.timeout:g}, "
            f"retries={self.retries}, concurrency={self.concurrency})"
        )

    def close(self) -> None:
        self._client.close()

    def _error(self, what: str, e: BaseException, attempts: int) -> EndpointError:
        """An EndpointError for an SDK exception, without the key and without a traceback chain."""
        o = self._openai
        if isinstance(e, EndpointError):
            return EndpointError(self._redact(f"{what}: {e}"))
        if isinstance(e, RecursionError):
            return EndpointError(f"{what}: the reply is nested too deeply to be a chat completion")
        if isinstance(e, o.APITimeoutError):
            return EndpointError(
                f"{what}: no complete reply within the {self.timeout:g} s deadline "
                f"({attempts} attempts); raise --timeout if the model is just slow"
            )
        if isinstance(e, o.APIConnectionError):
            cause = e.__cause__ or e.__context__
            detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(e)
            if isinstance(cause, self._httpx.ConnectError):
                problem = f"cannot reach {self.base_url}"
            else:  # connected, but the reply was cut short or not HTTP
                problem = f"no usable reply from {self.base_url}"
            return EndpointError(
                self._redact(
                    f"{what}: {problem} ({detail[:200]}) after {attempts} attempts. "
                    "Is the server running, and does the URL end with /v1?"
                )
            )
        if isinstance(e, o.APIStatusError):
            refused = e.response.headers.get(_REFUSED)
            if refused:
                return EndpointError(self._redact(f"{what}: {refused}"))
            code = e.status_code
            hint = ""
            if code in (401, 403):
                hint = " (check --api_key / OPENAI_API_KEY)"
            elif 300 <= code < 400:
                location = e.response.headers.get("location", "")[:200]
                hint = f" (a redirect to {location!r}; redirects are not followed: pass the final URL)"
            try:
                body = e.response.text[:300]
            except Exception:  # a body that cannot be decoded is left out
                body = ""
            return EndpointError(self._redact(f"{what}: HTTP {code}{hint} {body}".strip()))
        return EndpointError(self._redact(f"{what}: {type(e).__name__}: {str(e)[:300]}"))

    def _malformed(self, what: str, e: BaseException) -> EndpointError:
        """A reply the SDK could not parse (invalid JSON, a 5,000-digit integer, a shape it chokes on)."""
        return EndpointError(
            self._redact(
                f"{what}: the reply from {self.base_url} is malformed, not an OpenAI-compatible JSON reply "
                f"({type(e).__name__}: {str(e)[:200]})"
            )
        )

    def probe(self) -> list[str]:
        """GET ``/models`` and check that ``model`` is served; returns the served ids. Raises EndpointError."""
        where = f"{self.base_url}/models"
        try:
            # One retry at most: a refused connection at start-up is usually a wrong URL.
            retries = min(self.retries, 1)
            listing = self._client.with_options(max_retries=retries).get("/models", cast_to=object)
        except (self._openai.OpenAIError, EndpointError, RecursionError) as e:
            raise self._error(f"endpoint {where}", e, retries + 1) from None
        except (ValueError, TypeError, AttributeError) as e:  # the SDK parsing a malformed reply
            raise self._malformed(f"endpoint {where}", e) from None
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            raise EndpointError(f"{where} is not an OpenAI-compatible model list (no 'data' array)")
        served = [str(m.get("id"))[:200] for m in data if isinstance(m, dict) and m.get("id") is not None]
        if self.model not in served:
            shown = ", ".join(served[:20]) + (", ..." if len(served) > 20 else "")
            raise EndpointError(
                self._redact(
                    f"model {self.model!r} is not served by {self.base_url}; served: {shown or 'none'}"
                )
            )
        return served

    def _complete(self, messages: list[dict], generation_prefix: str = "") -> str:
        s = self.sampling
        extra: dict[str, Any] = {}
        if generation_prefix:
            # The prefix as the start of the assistant message, continued rather than closed: vLLM's and SGLang's
            # chat-completion extensions. OpenAI's hosted API has no such option.
            messages = [*messages, {"role": "assistant", "content": generation_prefix}]
            extra["extra_body"] = {"continue_final_message": True, "add_generation_prompt": False}
        try:
            reply = self._client.chat.completions.create(
                model=self.model,
                messages=cast(Any, messages),  # plain role/content dicts, as the endpoint takes them
                temperature=s.temperature,
                top_p=s.top_p,
                max_tokens=s.max_new_tokens,
                **extra,
            )
        except (self._openai.OpenAIError, EndpointError, RecursionError) as e:
            raise self._error("chat completion failed", e, self.retries + 1) from None
        except (ValueError, TypeError, AttributeError) as e:  # the SDK parsing a malformed reply
            raise self._malformed("chat completion failed", e) from None
        text: object
        try:
            text = reply.choices[0].message.content
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):  # a reply of another shape
            text = 0  # reported below
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise EndpointError(
                f"chat completion failed: the reply from {self.base_url} is not an OpenAI chat completion "
                "(no choices[0].message.content string)"
            )
        try:
            usage = getattr(reply, "usage", None)
            tokens = getattr(usage, "completion_tokens", None)
        except (ValueError, TypeError):  # e.g. a 5,000-digit count the SDK cannot convert
            tokens = None
        if is_int(tokens, numpy=False) and tokens >= 0:
            with self._tokens_lock:
                self.generated_tokens += tokens
        return text

    def __call__(self, batch: list[list[dict]], generation_prefix: str = "") -> list[str]:
        """One reply per chat. With ``generation_prefix`` (RAGEN chat style) the server continues an assistant
        message that starts with it (needs vLLM or SGLang) and the reply is the text after it."""
        if not batch:
            return []
        if len(batch) == 1 or self.concurrency == 1:
            return [self._complete(m, generation_prefix) for m in batch]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(batch))) as pool:
            return list(pool.map(lambda m: self._complete(m, generation_prefix), batch))


__all__ = ["DEFAULT_MAX_REPLY_BYTES", "EndpointError", "HFPolicy", "OpenAIPolicy", "SamplingParams"]
