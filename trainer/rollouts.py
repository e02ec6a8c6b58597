"""Token-level multi-turn rollouts for training, returned through TRL's ``rollout_func`` contract.

Each trajectory is ``prompt_ids`` (system + first state, rendered with the generation prompt) followed by
``completion_ids`` = model tokens of turn 1, the end-of-turn token, the chat-template tokens of the next
observation, model tokens of turn 2, ... ``env_mask`` is 1 on tokens the model sampled and 0 on everything the
environment or the template contributed (observations, role headers, an end-of-turn token we had to add).
Ids are concatenated, never re-tokenised from decoded text: the tokens between two model turns are the
*difference* between the chat template rendered with ``k`` and with ``k + 1`` turns, which also handles templates
whose generation prompt is not a plain prefix of the rendered assistant turn. If even that difference is not a
prefix (a template that rewrites history, e.g. dropping earlier reasoning),
:class:`~llm_gym.agent.templates.ChatTemplateError` says so (the template glue,
:class:`~llm_gym.trainer.chat_templates.ChatTemplateTokens`, lives in :mod:`llm_gym.trainer.chat_templates`).

All active environments of a turn are generated in one batch (left padding + attention mask). With several
processes, every rank runs the same number of generation calls (finished ranks feed a dummy row) so that FSDP /
ZeRO-3 forwards and vLLM server collectives stay in lockstep.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from llm_gym.trainer import compat
from llm_gym.trainer.chat_templates import ChatTemplateTokens, training_template_tokens

from llm_gym.agent.chat import ChatFormat, Conversation
from llm_gym.agent.records import EpisodeRecord, TurnRecord
from llm_gym.agent.rollout import MAX_TURNS_GUARD
from llm_gym.core.checks import is_int
from llm_gym.registration import make_env, pick_env_url

logger = logging.getLogger(__name__)

#: ``(contexts, max_new_tokens per row) -> (new token ids per row, sampler log-probs per row)``.
GenerateFn = Callable[[list[list[int]], list[int]], tuple[list[list[int]], list[list[float]]]]

_SEED_RE = re.compile(r'^\s*\{\s*"llmgym_seed"\s*:\s*(\d+)\s*\}\s*$')


# ------------------------------------------------------------------------------------------- seeds in prompts
def seed_prompt(seed: int) -> str:
    """The dataset prompt that carries an environment seed (``rollout_func`` only receives prompts)."""
    if not is_int(seed, numpy=False) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return json.dumps({"llmgym_seed": seed})


def parse_seed_prompt(prompt: Any) -> int:
    """Inverse of :func:`seed_prompt`."""
    m = _SEED_RE.match(prompt) if isinstance(prompt, str) else None
    if m is None:
        raise ValueError(
            f"expected a seed prompt like {seed_prompt(0)!r} (built by trainer.rollouts.seed_dataset), got {prompt!r}"
        )
    return int(m.group(1))


def seed_dataset(seeds: Sequence[int]):
    """A ``datasets.Dataset`` with one seed prompt per row, in order."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [seed_prompt(int(s)) for s in seeds]})


# ----------------------------------------------------------------------------------------------- the episodes
@dataclass
class TokenEpisode:
    """One trajectory being built: ids, masks, per-turn spans and the env record."""

    env: Any
    conv: Conversation
    seed: int
    prompt_ids: list[int]
    record: EpisodeRecord
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_spans: list[list[int]] = field(default_factory=list)
    done: bool = False
    stop_reason: str = ""
    #: ``Conversation.generation_prefix`` of this episode's env (RAGEN style: ``<think>``, or ``<answer>`` for an
    #: env with ``think=False``) and its ids: prompt context after each generation prompt, never trained.
    prefix: str = ""
    prefix_ids: list[int] = field(default_factory=list)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def add(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        self.completion_ids.extend(int(i) for i in ids)
        self.env_mask.extend([mask] * len(ids))
        self.logprobs.extend(list(logprobs) if logprobs is not None else [0.0] * len(ids))

    @property
    def episode_reward(self) -> float:
        return self.record.total_reward

    @property
    def success(self) -> bool:
        return self.record.success


def play_token_episodes(
    env_id: str,
    seeds: Sequence[int],
    generate: GenerateFn,
    template: ChatTemplateTokens,
    *,
    max_new_tokens: int,
    max_completion_length: int,
    env_kwargs: dict | None = None,
    chat: ChatFormat | None = None,
    lockstep: Callable[[int], int] | None = None,
    meta: dict | None = None,
    group_size: int = 1,
    first_index: int = 0,
    group_dynamics: str = "shared",
    env_url: str | Sequence[str] | None = None,
) -> list[TokenEpisode]:
    """Play one episode per entry of ``seeds`` with token-level bookkeeping, batching every turn.

    Args:
        generate: the policy backend (see :data:`GenerateFn`).
        max_new_tokens: per-turn generation limit.
        max_completion_length: budget for all completion tokens (model + environment); enforced here.
        lockstep: maps this process's number of active rows to the maximum over processes (``None`` = one
            process); ranks with fewer rows pad with dummy rows so every rank calls ``generate`` equally often.
        group_size, first_index: used to record each sample's position in its group (``meta``).
        group_dynamics: ``"independent"``: each group member resets with ``options={"dynamics_seed": its index in
            the group}``, so members start identically but draw their own transitions (RAGEN); ``"shared"``: the
            members' transitions are identical too.
        env_url: play on ``llmgym serve`` servers (one address, or several used in turn per episode).
    """
    chat = chat or ChatFormat()
    if group_dynamics not in ("independent", "shared"):
        raise ValueError(f"group_dynamics must be 'independent' or 'shared', got {group_dynamics!r}")
    if chat.history_window is not None:
        raise ValueError("token-level rollouts train on the full history; history_window must be None")
    if max_completion_length < 2:
        raise ValueError("max_completion_length must be >= 2")
    tok = template.tokenizer
    env_kwargs = dict(env_kwargs or {})
    # ChatFormat(style="ragen") opens every reply with "<think>" ("<answer>" without thinking): prompt tokens after
    # the generation prompt (never trained), and part of the reply text the environment parses (RAGEN
    # ``ctx_manager.py`` adds it back too); ``Conversation.generation_prefix`` picks it per environment
    episodes: list[TokenEpisode] = []
    try:
        for i, seed in enumerate(seeds):
            env = make_env(env_id, env_kwargs, env_url=pick_env_url(env_url, first_index + i))
            member = (first_index + i) % group_size
            options = {"dynamics_seed": member} if group_dynamics == "independent" else None
            obs, _ = env.reset(seed=int(seed), options=options)
            conv = Conversation(env, chat)
            conv.add_observation(obs)
            rec = EpisodeRecord.from_reset(
                env,
                env_id,
                int(seed),
                obs,
                env_kwargs=env_kwargs,
                reset_options=options,
                meta={**(meta or {}), "group_index": (first_index + i) % group_size},
            )
            prefix = conv.generation_prefix
            prefix_ids = template.encode(prefix) if prefix else []
            prompt = template.prompt_ids(conv.messages()) + prefix_ids
            episodes.append(
                TokenEpisode(env, conv, int(seed), prompt, rec, prefix=prefix, prefix_ids=prefix_ids)
            )

        for _turn in range(MAX_TURNS_GUARD):
            active = [e for e in episodes if not e.done]
            n_rows = lockstep(len(active)) if lockstep is not None else len(active)
            if n_rows == 0:
                break
            budgets = [min(max_new_tokens, max_completion_length - len(e.completion_ids) - 1) for e in active]
            contexts = [e.context for e in active]
            if len(active) < n_rows:  # dummy rows keep ranks in lockstep; their output is discarded
                dummy = episodes[0].prompt_ids if episodes else [tok.eos_token_id or 0]
                contexts += [dummy] * (n_rows - len(active))
                budgets += [1] * (n_rows - len(active))
            new_ids, new_lps = generate(contexts, budgets)
            for e, ids, lps, budget in zip(active, new_ids, new_lps, budgets):
                _finish_turn(
                    e,
                    list(ids)[: max(budget, 0)],
                    list(lps)[: max(budget, 0)],
                    template,
                    max_completion_length,
                )
    finally:
        for e in episodes:
            e.env.close()
        release = getattr(generate, "release", None)
        if callable(release):  # a carried KV cache must not outlive this round's weights
            release()
    return episodes


def _finish_turn(
    e: TokenEpisode,
    ids: list[int],
    lps: list[float],
    template: ChatTemplateTokens,
    max_completion_length: int,
) -> None:
    """Append one model turn (cut at the first stop token), step the env, append the next observation.

    The episode's generation prefix (RAGEN chat style) starts the reply text the environment sees, and its
    tokens end the next turn's untrained between-turn tokens."""
    prefix = e.prefix
    stop = set(template.stop_ids)
    cut = next((k + 1 for k, t in enumerate(ids) if t in stop), None)
    if cut is not None:
        ids, lps = ids[:cut], lps[:cut]
    start = len(e.completion_ids)
    e.add(ids, 1, lps)
    e.turn_spans.append([start, len(e.completion_ids)])
    if not ids or ids[-1] != template.end_of_turn_id:
        e.add([template.end_of_turn_id], 0)  # close the turn ourselves: not sampled, so no loss on it
    # The env judges exactly the text of the sampled tokens, and the record holds it: only the stop token that
    # ends the reply is left out. Other special tokens stay as text, so "<answer>Le<|im_start|>ft</answer>" is
    # not a valid "Left" (skipping them would score text the model never produced).
    reply = ids[:-1] if ids and ids[-1] in stop else ids
    text = prefix + template.tokenizer.decode(
        reply, skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    obs, reward, terminated, truncated, info = e.env.step(text)
    e.conv.add_reply(text)
    e.record.turns.append(TurnRecord.from_step(text, obs, reward, terminated, truncated, info))
    if terminated or truncated:
        e.done, e.stop_reason = True, "terminated" if terminated else "truncated"
        return
    history = e.conv.messages(window=None)
    user = e.conv.add_observation(obs, reward=float(reward), info=info)
    between = template.between_turns_ids(history, user) + e.prefix_ids
    # Room for the observation, at least one model token and an end-of-turn token.
    if len(e.completion_ids) + len(between) + 2 > max_completion_length:
        e.done, e.stop_reason = True, "budget"
        return
    e.add(between, 0)


# ------------------------------------------------------------------------------------------ generation backends
class HFGenerate:
    """Batched ``model.generate`` with left padding; returns new ids and zero log-probs (TRL needs sampler
    log-probs only for vLLM importance sampling).

    ``sharing``: prefill each turn's shared prefixes once (:mod:`~llm_gym.trainer.prefix_sharing`). ``turn_cache``:
    carry each episode's KV cache from one turn to the next, so a later turn prefills only its new tokens
    (:mod:`~llm_gym.trainer.turn_cache`); the carried cache lives until :meth:`release`, which
    :func:`play_token_episodes` calls at the end of its round (it must not outlive a weight update)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        generation_config: Any,
        stop_ids: Sequence[int],
        device: Any,
        sharing: Any = None,
        lockstep: bool = False,
        turn_cache: Any = None,
    ):
        self.model = model
        #: A :class:`~llm_gym.trainer.prefix_sharing.PrefixSharing` (prefill shared prefixes once), or None.
        self.sharing = sharing
        self.lockstep = lockstep
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
        self.generation_config = copy.deepcopy(generation_config)
        self.generation_config.eos_token_id = list(stop_ids)
        self.generation_config.pad_token_id = self.pad_id
        self.device = device
        #: A :class:`~llm_gym.trainer.turn_cache.TurnCache` (settings and counts), or None.
        self.turn_cache = turn_cache
        self._session: Any = None
        if turn_cache is not None:
            from llm_gym.trainer import turn_cache as tc

            obstacle = tc.config_obstacle(self.generation_config)
            if obstacle is None:
                self._session = tc.TurnSession(turn_cache)
            else:
                turn_cache.note(f"off for this generation config: {obstacle}")

    def release(self) -> None:
        """Drop the carried KV cache (the end of a rollout round)."""
        if self._session is not None:
            self._session.release()

    def __call__(
        self, contexts: list[list[int]], budgets: list[int]
    ) -> tuple[list[list[int]], list[list[float]]]:
        import torch

        cfg = copy.copy(self.generation_config)
        cfg.max_new_tokens = max(1, max(budgets))
        if self._session is not None:
            new = self._turn_cached(contexts, cfg).tolist()
            return new, [[0.0] * len(row) for row in new]
        if self.sharing is not None:
            from llm_gym.trainer import prefix_sharing

            layout = prefix_sharing.share_prompts(contexts, self.sharing.min_saved)
            # with several processes every rank takes the same path (the same forwards, for sharded models)
            if layout is not None and (layout.shares or self.lockstep):
                self.sharing.generation.add(*layout.tokens())
                new_ids = prefix_sharing.generate_shared(self.model, layout, cfg, self.pad_id, self.device)
                new = new_ids.tolist()
                return new, [[0.0] * len(row) for row in new]
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, width - len(c) :] = torch.tensor(c, dtype=torch.long)
            attn[i, width - len(c) :] = 1
        if self.sharing is not None:
            self.sharing.generation.add(len(contexts) * width, len(contexts) * width)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=attn.to(self.device), generation_config=cfg
            )
        new = out[:, width:].tolist()
        return new, [[0.0] * len(row) for row in new]

    def _turn_cached(self, contexts: list[list[int]], cfg: Any) -> Any:
        """One turn with the carried cache: continue from it where rows have one (a later turn), else today's
        path (the first turn, or after a turn over the budget: prefix-shared generation where it shares, else
        plain), and carry the cache ``generate`` finished with into the next turn. With several processes every
        rank runs the same forwards: the first turn today's path, every later one a single ``generate``. Prefix
        sharing counts the calls it runs; the turn cache counts every call against today's path."""
        from llm_gym.trainer import prefix_sharing
        from llm_gym.trainer import turn_cache as tc

        session = self._session
        first = session.calls == 0
        session.calls += 1
        plain = len(contexts) * max(len(c) for c in contexts)
        layout = (
            prefix_sharing.share_prompts(contexts, self.sharing.min_saved)
            if self.sharing is not None
            else None
        )
        shares = layout is not None and (layout.shares or self.lockstep)
        today = layout.tokens()[0] if layout is not None and shares else plain
        if session.carried is not None or (self.lockstep and not first):
            # several processes: no extra bucketed prefill forwards (their count would differ between ranks)
            new, cache, mask, prefill = tc.generate_continued(
                self.model,
                contexts,
                session.carried,
                cfg,
                self.pad_id,
                self.device,
                max_padding=math.inf if self.lockstep else tc.MAX_PADDING,
            )
        elif layout is not None and shares:
            new, cache, mask = prefix_sharing.generate_shared_with_cache(
                self.model, layout, cfg, self.pad_id, self.device
            )
            prefill = today
            self.sharing.generation.add(today, plain)  # prefix sharing's own count: the calls it ran
        else:
            new, cache, mask, prefill = tc.generate_continued(
                self.model, contexts, None, cfg, self.pad_id, self.device
            )
        session.keep(cache, mask, contexts, new)
        session.turn_cache.stats.add(prefill, today, plain)
        return new


def vllm_stop_kwargs(stop_ids: Sequence[int]) -> dict[str, Any]:
    """vLLM ``SamplingParams`` fields that end a turn at the template's stop tokens. TRL passes none, so vLLM stops
    at the tokenizer's and generation config's eos only: ``<|endoftext|>`` for a Qwen2.5 base model, whose turns
    end with ``<|im_end|>`` (the reply is cut there afterwards, but every turn runs to its token budget)."""
    return {"stop_token_ids": [int(t) for t in stop_ids]}


class VLLMGenerate:
    """Generation through TRL's ``trainer.vllm_generation`` (colocate or server), stopping at ``stop_ids``.
    Untested here (no vLLM); ``benchmarks/gpu_check.py --use_vllm`` checks the stop on a GPU."""

    def __init__(self, vllm_generation: Any, stop_ids: Sequence[int] = ()):
        self.vllm = vllm_generation
        self.stop_ids = list(stop_ids)

    def __call__(
        self, contexts: list[list[int]], budgets: list[int]
    ) -> tuple[list[list[int]], list[list[float]]]:
        saved = self.vllm.max_completion_length
        saved_kwargs = getattr(self.vllm, "generation_kwargs", None)
        self.vllm.max_completion_length = max(1, max(budgets))
        if self.stop_ids:  # TRL turns generation_kwargs into SamplingParams (colocate and server alike)
            self.vllm.generation_kwargs = {**(saved_kwargs or {}), **vllm_stop_kwargs(self.stop_ids)}
        try:
            # num_generations=1: every row is its own request, so server-mode de-duplication never merges rows.
            _, completion_ids, logprobs, _ = self.vllm.generate(
                prompts=contexts, images=None, num_generations=1
            )
        finally:
            self.vllm.max_completion_length = saved
            if self.stop_ids:
                self.vllm.generation_kwargs = saved_kwargs
        # NaN marks a missing sampler log-prob: TRL's importance-sampling correction turns it into ratio 1,
        # whereas 0.0 would claim probability 1 and distort the ratio.
        lps = [[(float(lp[0]) if lp and lp[0] is not None else math.nan) for lp in row] for row in logprobs]
        return [list(r) for r in completion_ids], lps


# -------------------------------------------------------------------------------------------- rollout_func
def _lockstep_fn(accelerator: Any) -> Callable[[int], int] | None:
    if accelerator is None or accelerator.num_processes <= 1:
        return None
    import torch

    def sync(n: int) -> int:
        t = torch.tensor([n], device=accelerator.device)
        return int(accelerator.gather(t).max().item())

    return sync


class EnvRolloutFunc:
    """``rollout_func`` for ``GRPOTrainer``: seed prompts in, multi-turn token trajectories out.

    Returns ``prompt_ids``, ``completion_ids``, ``logprobs``, ``env_mask`` and the extra fields ``env_reward``,
    ``env_success`` and ``env_turns`` (forwarded by TRL to the reward functions). The per-sample extras of the
    latest call (turn spans, seeds, group indices, episode records, ...) are kept in :attr:`last`, which the
    trainer exposes as ``last_rollout``.
    """

    def __init__(self, args: Any, tokenizer: Any):
        self.args = args
        # The tokenizer's template, or TRL's training variant of one that rewrites history (logged).
        self.template = training_template_tokens(tokenizer)
        #: The :class:`RolloutInfo` of the latest call (None before the first).
        self.last: RolloutInfo | None = None
        self._checked_vllm = False

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        import torch

        args = self.args
        training = bool(trainer.model.training)
        seeds = [parse_seed_prompt(p) for p in prompts]
        accelerator = getattr(trainer, "accelerator", None)
        group_size = trainer.num_generations if training else (trainer.num_generations_eval or 1)
        first_index = (accelerator.process_index if accelerator is not None else 0) * len(prompts)
        lockstep = _lockstep_fn(accelerator)
        max_len = trainer.max_completion_length
        meta = {"step": int(trainer.state.global_step), "mode": "train" if training else "eval"}
        kwargs = dict(
            max_new_tokens=args.max_new_tokens,
            max_completion_length=max_len,
            env_kwargs=args.make_env_kwargs(),
            chat=args.chat_format(),
            lockstep=lockstep,
            meta=meta,
            group_size=group_size,
            first_index=first_index,
            group_dynamics=getattr(args, "group_dynamics", "independent"),
            env_url=getattr(args, "env_url", None),
        )
        if getattr(trainer, "use_vllm", False):
            vllm = trainer.vllm_generation
            if not self._checked_vllm:
                from llm_gym.trainer.prefix_sharing import vllm_prefix_caching

                self._checked_vllm = True
                if vllm_prefix_caching(vllm) is False:
                    logger.warning(
                        "vLLM prefix caching is off: every rollout of a group prefills its prompt again; "
                        "enable it (vLLM's enable_prefix_caching) for prefix-shared generation"
                    )
            saved_temperature = vllm.temperature
            if not training:  # VLLMGeneration reads its temperature at call time
                vllm.temperature = args.eval_temperature
            try:
                episodes = play_token_episodes(
                    args.env, seeds, VLLMGenerate(vllm, self.template.stop_ids), self.template, **kwargs
                )
            finally:
                vllm.temperature = saved_temperature
        else:
            from trl.models import unwrap_model_for_generation

            gen_cfg = copy.deepcopy(trainer.generation_config)
            if not training:
                if args.eval_temperature > 0:
                    gen_cfg.temperature, gen_cfg.do_sample = args.eval_temperature, True
                else:
                    gen_cfg.do_sample = False
            from llm_gym.trainer.deprecations import old_checkpointing_names

            ctx = compat.distributed_backend(trainer)  # FSDP: gather the sharded weights for generation
            with (
                old_checkpointing_names(),  # TRL toggles checkpointing through transformers' deprecated names
                unwrap_model_for_generation(
                    trainer.model_wrapped,
                    trainer.accelerator,
                    gather_deepspeed3_params=args.ds3_gather_for_generation,
                    generation_kwargs=trainer.generation_kwargs,
                    gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
                ) as model,
                torch.no_grad(),
                # bf16 autocast on the float32 weights also before train() prepares the model (the first evaluation)
                accelerator.autocast() if accelerator is not None else nullcontext(),
                ctx.summon_full_params(trainer.model_wrapped, recurse=False)
                if ctx is not None
                else nullcontext(),
            ):
                gen = HFGenerate(
                    model,
                    self.template.tokenizer,
                    gen_cfg,
                    self.template.stop_ids,
                    trainer.accelerator.device,
                    sharing=getattr(trainer, "prefix_sharing", None),
                    lockstep=lockstep is not None,
                    turn_cache=getattr(trainer, "turn_cache", None),
                )
                episodes = play_token_episodes(args.env, seeds, gen, self.template, **kwargs)
        self.last = RolloutInfo.from_episodes(episodes)
        return rollout_output(episodes, sampler_logprobs=bool(getattr(trainer, "use_vllm", False)))


def rollout_output(episodes: list[TokenEpisode], *, sampler_logprobs: bool = True) -> dict[str, Any]:
    """The ``rollout_func`` dict for ``episodes``. ``sampler_logprobs=False`` returns ``logprobs=None`` (the HF
    ``generate`` backend has none, and placeholder zeros would mislead TRL options that read them, such as the
    off-policy mask)."""
    return {
        "prompt_ids": [e.prompt_ids for e in episodes],
        "completion_ids": [e.completion_ids for e in episodes],
        "logprobs": [e.logprobs for e in episodes] if sampler_logprobs else None,
        "env_mask": [e.env_mask for e in episodes],
        "env_reward": [e.episode_reward for e in episodes],
        "env_success": [float(e.success) for e in episodes],
        "env_turns": [len(e.record.turns) for e in episodes],
    }


@dataclass(frozen=True)
class RolloutInfo:
    """Per-sample extras of one generation round that TRL's ``rollout_func`` contract has no room for, in row
    order of this process: the trainer logs ``env/*`` metrics and writes records from them, and the MI metrics
    read each turn's token span."""

    turn_spans: list[list[list[int]]]
    episode_reward: list[float]
    success: list[bool]
    seed: list[int]
    group_index: list[int]
    turns: list[int]
    valid_action_rate: list[float]
    effective_action_rate: list[float]
    stop_reason: list[str]
    records: list[EpisodeRecord]

    @classmethod
    def from_episodes(cls, episodes: Sequence[TokenEpisode]) -> RolloutInfo:
        return cls(
            turn_spans=[e.turn_spans for e in episodes],
            episode_reward=[e.episode_reward for e in episodes],
            success=[e.success for e in episodes],
            seed=[e.seed for e in episodes],
            group_index=[e.record.meta.get("group_index", 0) for e in episodes],
            turns=[len(e.record.turns) for e in episodes],
            valid_action_rate=[_rate(e, "action_is_valid") for e in episodes],
            effective_action_rate=[_rate(e, "action_is_effective") for e in episodes],
            stop_reason=[e.stop_reason for e in episodes],
            records=[e.record for e in episodes],
        )


def _rate(e: TokenEpisode, key: str) -> float:
    turns = e.record.turns
    return sum(bool(t.info.get(key, False)) for t in turns) / len(turns) if turns else 0.0


def env_reward(completions: list, env_reward: list[float], **_: Any) -> list[float | None]:
    """Reward function for TRL: the episode reward computed during the rollout (sum of turn rewards); TRL's
    contract lets a reward function return None for a row it cannot score, this one never does."""
    return [float(r) for r in env_reward]
