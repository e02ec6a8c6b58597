"""Text policies for evaluation: a batch of chats in, one reply per chat out (``llm_gym.agent.rollout.Policy``).

- :class:`HFPolicy`: a local transformers model; all chats of a turn go through one left-padded ``generate``.
- :class:`OpenAIPolicy`: any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, llama.cpp, TGI, ...),
  stdlib ``urllib`` only; :meth:`OpenAIPolicy.probe` checks the endpoint and model before any episode runs.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


class EndpointError(ValueError):
    """An OpenAI-compatible endpoint that cannot be used; the message says what to check."""


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings shared by every policy (RAGEN-2 evaluates with T = 0.5 sampling)."""

    temperature: float = 0.5
    top_p: float = 1.0
    max_new_tokens: int = 400

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and 0.0 <= self.temperature <= 10.0):
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or self.max_new_tokens < 1
        ):
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
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams()
        self.batch_size = batch_size
        self.generated_tokens = 0  # running count, for throughput reports
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self._eos = self._eos_ids()
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

    def _eos_ids(self) -> list[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.tokenizer):
            eos = getattr(source, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, (list, tuple)):
                ids.update(int(e) for e in eos)
        return sorted(ids)

    def __call__(self, batch: list[list[dict]]) -> list[str]:
        if not batch:
            return []
        step = self.batch_size or len(batch)
        out: list[str] = []
        for start in range(0, len(batch), step):
            out.extend(self._generate(batch[start : start + step]))
        return out

    def _generate(self, chats: list[list[dict]]) -> list[str]:
        import torch
        from transformers import GenerationConfig

        texts = [
            self.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats
        ]
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
        return [
            self.tokenizer.decode(row[:n], skip_special_tokens=True) for row, n in zip(new.tolist(), lengths)
        ]


class OpenAIPolicy:
    """A model served behind an OpenAI-compatible API (``POST {base_url}/chat/completions``).

    Chats of a turn are sent concurrently (``concurrency`` threads), each as one request; transient failures
    (connection errors, HTTP 429 / 5xx) are retried ``retries`` times with exponential backoff.
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
        backoff: float = 1.0,
    ):
        parsed = urllib.parse.urlparse(base_url or "")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise EndpointError(
                f"endpoint must be an http(s) URL such as http://localhost:8000/v1, got {base_url!r}"
            )
        if not model or not isinstance(model, str):
            raise EndpointError("--model must name the served model when --endpoint is given")
        if concurrency < 1 or retries < 0 or timeout <= 0:
            raise ValueError("concurrency must be >= 1, retries >= 0 and timeout > 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sampling = sampling or SamplingParams()
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout
        self.concurrency = concurrency
        self.retries = retries
        self.backoff = backoff
        self.generated_tokens = 0

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode("utf-8") if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            payload = resp.read().decode("utf-8")
        try:
            return json.loads(payload)
        except json.JSONDecodeError:
            raise EndpointError(f"{self.base_url}{path} did not return JSON: {payload[:200]!r}") from None

    def probe(self) -> list[str]:
        """GET ``/models`` and check that ``model`` is served; returns the served ids. Raises EndpointError."""
        where = f"{self.base_url}/models"
        try:
            listing = self._request("GET", "/models")
        except urllib.error.HTTPError as e:
            hint = " (check --api-key / OPENAI_API_KEY)" if e.code in (401, 403) else ""
            raise EndpointError(f"endpoint {where} answered HTTP {e.code} {e.reason}{hint}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise EndpointError(
                f"cannot reach {where}: {reason}. Is the server running, and does the URL end with /v1?"
            ) from None
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            raise EndpointError(f"{where} is not an OpenAI-compatible model list (no 'data' array)")
        served = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]
        if self.model not in served:
            raise EndpointError(
                f"model {self.model!r} is not served by {self.base_url}; served: {', '.join(served) or 'none'}"
            )
        return served

    def _complete(self, messages: list[dict]) -> str:
        s = self.sampling
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_new_tokens,
        }
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                reply = self._request("POST", "/chat/completions", body)
                break
            except urllib.error.HTTPError as e:
                if e.code not in (408, 429) and e.code < 500 or attempt == self.retries:
                    detail = e.read().decode("utf-8", "replace")[:300] if e.fp else ""
                    raise EndpointError(
                        f"chat completion failed: HTTP {e.code} {e.reason} {detail}".strip()
                    ) from None
            except (urllib.error.URLError, OSError) as e:
                if attempt == self.retries:
                    raise EndpointError(f"chat completion failed: {getattr(e, 'reason', e)}") from None
            time.sleep(delay)
            delay *= 2
        try:
            text = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"unexpected chat completion response: {json.dumps(reply)[:300]}") from None
        usage = reply.get("usage") if isinstance(reply, dict) else None
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.generated_tokens += usage["completion_tokens"]
        return text or ""

    def __call__(self, batch: list[list[dict]]) -> list[str]:
        if not batch:
            return []
        if len(batch) == 1 or self.concurrency == 1:
            return [self._complete(m) for m in batch]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(batch))) as pool:
            return list(pool.map(self._complete, batch))


__all__ = ["EndpointError", "HFPolicy", "OpenAIPolicy", "SamplingParams"]
