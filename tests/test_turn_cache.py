"""The KV cache carried across turns (``llm_gym.trainer.turn_cache``): its pure pieces (matching by tokens, the
cache layout, gathering), exactness against today's path (every step's logits and the sampled tokens, for ChatML,
SmolLM2 and Llama-3 templates, with and without prefix sharing, sdpa and eager attention; SmolLM2 in a slow
test), the memory budget's fallback, the refusals, and the trainer wired to it (training rows unchanged)."""

from __future__ import annotations

import copy
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from llm_gym.trainer import prefix_sharing as ps  # noqa: E402
from llm_gym.trainer import turn_cache as tc  # noqa: E402

TOL = 1e-5
#: The learning study's FrozenLake setting: deterministic 3x3 CoordFrozenLake, 3 turns of one action.
FROZEN_LAKE = ("llmgym/CoordFrozenLake-v0", {"success_rate": 1.0, "size": 3, "max_turns": 3})


# ------------------------------------------------------------------------------------------ pure pieces
tokens = st.lists(st.integers(0, 3), min_size=0, max_size=12)


@settings(max_examples=200, deadline=None)
@given(a=tokens, b=tokens)
def test_common_prefix_is_the_longest_equal_prefix(a, b):
    n = tc.common_prefix(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


@settings(max_examples=200, deadline=None)
@given(carried=st.lists(tokens, max_size=8), contexts=st.lists(tokens.filter(len), min_size=1, max_size=8))
def test_match_rows_finds_the_most_usable_cached_tokens(carried, contexts):
    """Against brute force: the chosen row's tokens start with the usable part of the context, no row offers
    more, and the context's last token is never taken from the cache (its logits must be computed)."""
    for c, (row, usable) in zip(contexts, tc.match_rows(carried, contexts)):
        best = max((min(tc.common_prefix(t, c), len(c) - 1) for t in carried), default=0)
        assert usable == best
        assert usable <= len(c) - 1
        if usable:
            assert carried[row][:usable] == c[:usable]
        else:
            assert row == -1


def test_continued_inputs_put_cached_then_new_tokens_each_left_padded():
    ids, mask, W, S = tc.continued_inputs(
        [[5, 6, 7, 8], [1, 2, 3], [9, 9]], [(0, 3), (-1, 0), (2, 1)], pad_id=0
    )
    assert (W, S) == (3, 3)
    assert ids.tolist() == [[5, 6, 7, 0, 0, 8], [0, 0, 0, 1, 2, 3], [0, 0, 9, 0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1, 0, 0, 1], [0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1]]


def fake_layers(rows, width, heads=2, dim=3, n_layers=2):
    """Keys whose entries encode (layer, row, column), values their negatives."""
    out = []
    for layer in range(n_layers):
        r = torch.arange(rows).view(rows, 1, 1, 1).float()
        c = torch.arange(width).view(1, 1, width, 1).float()
        k = (layer * 10_000 + r * 100 + c).expand(rows, heads, width, dim).clone()
        out.append((k, -k))
    return out


def test_carried_from_maps_each_token_to_its_cache_column():
    # two rows: contexts [5, 6] (one pad column first) and [7, 8, 9]; three new tokens each, two of them fed
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    new = torch.tensor([[1, 2, 3], [4, 0, 0]])
    carried = tc.carried_from(fake_layers(2, 5), mask, [[5, 6], [7, 8, 9]], new[:, :-1])
    assert carried.tokens == [[5, 6, 1, 2], [7, 8, 9, 4, 0]]
    assert carried.columns == [[1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert carried.nbytes == 2 * 2 * (2 * 2 * 5 * 3) * 4
    # a cache that does not hold every fed token (here one column short), or a mask that disagrees with the
    # contexts, is not carried
    assert tc.carried_from(fake_layers(2, 4), mask, [[5, 6], [7, 8, 9]], new[:, :-1]) is None
    assert tc.carried_from(fake_layers(2, 5), mask, [[5, 6, 6], [7, 8, 9]], new[:, :-1]) is None


def test_gather_layers_left_pads_each_rows_cached_columns():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    layers = fake_layers(2, 5)
    carried = tc.carried_from(layers, mask, [[5, 6], [7, 8, 9]], torch.tensor([[1, 2], [4, 0]]))
    # context A continues row 1 for 4 tokens, context B row 0 for 2 tokens, context C has no cache
    out = tc.gather_layers(carried, [(1, 4), (0, 2), (-1, 0)], width=4)
    for layer, (k, v) in enumerate(out):
        assert k.shape == (3, 2, 4, 3) and torch.equal(v, -k)
        assert k[0, 0, :, 0].tolist() == [layer * 10_000 + 100 + c for c in (0, 1, 2, 3)]
        assert k[1, 0, 2:, 0].tolist() == [layer * 10_000 + c for c in (1, 2)]


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), max_size=20), bound=st.sampled_from([0.0, 0.05, 0.5]))
def test_prefill_buckets_bound_the_padding(lengths, bound):
    buckets = tc.prefill_buckets(lengths, bound)
    rows = sorted(i for b in buckets for i in b)
    assert rows == [i for i, n in enumerate(lengths) if n > 0]  # every row with tokens, once
    real = sum(lengths)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in buckets)
    assert padded <= (1 + bound) * real or all(len({lengths[i] for i in b}) == 1 for b in buckets)


def test_config_obstacles_name_what_reads_the_padded_ids():
    from transformers import GenerationConfig

    assert tc.config_obstacle(GenerationConfig(do_sample=True)) is None
    assert "repetition_penalty" in tc.config_obstacle(GenerationConfig(repetition_penalty=1.2))
    assert "no_repeat_ngram_size" in tc.config_obstacle(GenerationConfig(no_repeat_ngram_size=3))
    assert "cache_implementation" in tc.config_obstacle(GenerationConfig(cache_implementation="static"))


def test_summary_line_counts_prefill_against_today():
    t = tc.TurnCache(budget_mib=1)
    assert tc.summary_line(t) == "turn cache: no generation ran"
    t.stats.add(250, 1000, 4000)
    t.stats.over_budget = 2
    line = tc.summary_line(t)
    assert "generation prefill 250 tokens vs 1,000 without it (4.00x fewer; 4,000 plain)" in line
    assert "2 turns re-prefilled over the 1 MiB budget" in line
    with pytest.raises(ValueError, match="turn_cache_budget_mib"):
        tc.TurnCache(budget_mib=-1)


# ------------------------------------------------------------------------------------------ exactness
class Recorder:
    """Every next-token logits row a model computes inside ``generate`` (the shared path's prefix prefill runs
    outside it and predicts nothing)."""

    def __init__(self, model):
        self.model, self.logits, self.inside = model, [], False
        self._hook = model.register_forward_hook(self._record)
        self._generate = model.generate
        model.generate = self._wrapped

    def _record(self, module, args, out):
        if self.inside:
            self.logits.append(out.logits[:, -1].detach().clone())

    def _wrapped(self, *args, **kwargs):
        self.inside = True
        try:
            return self._generate(*args, **kwargs)
        finally:
            self.inside = False

    def close(self):
        self._hook.remove()
        del self.model.generate


def play(model, tok, *, turn_cache, sharing, seeds=(3, 3, 3, 3, 7, 7, 7, 7), budget=None, seed=0):
    from llm_gym.trainer.chat_templates import ChatTemplateTokens
    from llm_gym.trainer.rollouts import HFGenerate, play_token_episodes

    template = ChatTemplateTokens(tok)
    cfg = model.generation_config
    cfg.do_sample, cfg.temperature = True, 1.0
    cache = tc.TurnCache(**({} if budget is None else {"budget_mib": budget})) if turn_cache else None
    gen = HFGenerate(
        model,
        tok,
        cfg,
        template.stop_ids,
        torch.device("cpu"),
        sharing=ps.PrefixSharing() if sharing else None,
        turn_cache=cache,
    )
    rec = Recorder(model)
    try:
        torch.manual_seed(seed)
        eps = play_token_episodes(
            FROZEN_LAKE[0],
            list(seeds),
            gen,
            template,
            max_new_tokens=8,
            max_completion_length=600,
            env_kwargs=FROZEN_LAKE[1],
            group_size=len(seeds) // 2,
        )
    finally:
        rec.close()
    return eps, rec.logits, cache


def assert_same_rollouts(a, b, tol=TOL):
    (eps_a, logits_a, _), (eps_b, logits_b, _) = a, b
    assert [e.prompt_ids for e in eps_a] == [e.prompt_ids for e in eps_b]
    assert [e.completion_ids for e in eps_a] == [e.completion_ids for e in eps_b]
    assert [e.env_mask for e in eps_a] == [e.env_mask for e in eps_b]
    assert len(logits_a) == len(logits_b) > 0
    for x, y in zip(logits_a, logits_b):
        assert x.shape == y.shape and float((x - y).abs().max()) < tol


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from tests._tiny import build_tiny_model

    return {
        style: build_tiny_model(tmp_path_factory.mktemp(f"turn_{style}"), template=style)
        for style in ("chatml", "smollm2", "llama3")
    }


def load(path, attn="sdpa"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn).float().eval()
    return model, AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("style", ["chatml", "smollm2", "llama3"])
@pytest.mark.parametrize("sharing", [True, False])
def test_turn_cache_samples_the_same_tokens_with_the_same_logits(tiny_models, style, sharing):
    model, tok = load(tiny_models[style])
    today = play(model, tok, turn_cache=False, sharing=sharing)
    cached = play(model, tok, turn_cache=True, sharing=sharing)
    assert max(len(e.record.turns) for e in cached[0]) == 3  # later turns did continue from the cache
    assert_same_rollouts(today, cached)
    stats = cached[2].stats
    assert 0 < stats.prefill < stats.today <= stats.plain and stats.over_budget == 0 and stats.peak_mib > 0
    # the first turn is today's path; each later turn prefills only what the episodes added
    first_turn = len(today[0][0].prompt_ids) * 8
    assert stats.plain - stats.prefill > first_turn


def test_bucketed_prefill_continues_exactly(tiny_models):
    """Rows whose new tokens differ in length are fed in buckets before ``generate`` (bounded padding): the same
    tokens and logits as one padded prefill and as the plain path from scratch."""
    model, _ = load(tiny_models["chatml"])
    cfg = model.generation_config
    cfg.do_sample, cfg.max_new_tokens, cfg.eos_token_id = True, 5, [1]
    g = torch.Generator().manual_seed(0)
    first = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (30, 30, 41, 12)]
    torch.manual_seed(0)
    new, cache, mask, _ = tc.generate_continued(model, first, None, cfg, 0, "cpu")
    carried = tc.carried_from(tc.cache_layers(cache), mask, first, new[:, :-1])
    extra = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (1, 9, 27, 3)]
    later = [c + t + e for c, t, e in zip(first, new.tolist(), extra)]
    out = {}
    for name, source, bound in (
        ("buckets", carried, 0.0),
        ("padded", carried, float("inf")),
        ("plain", None, 0.0),
    ):
        rec = Recorder(model)
        try:
            torch.manual_seed(1)
            # generate_continued uses its carried cache up (frees each layer once gathered): a copy per path
            tokens, _, _, prefill = tc.generate_continued(
                model, later, copy.deepcopy(source), cfg, 0, "cpu", max_padding=bound
            )
        finally:
            rec.close()
        out[name] = (tokens, rec.logits, prefill)
    assert out["buckets"][2] < out["padded"][2] < out["plain"][2]
    for name in ("padded", "plain"):
        assert torch.equal(out["buckets"][0], out[name][0])
        assert len(out["buckets"][1]) == len(out[name][1])
        for x, y in zip(out["buckets"][1], out[name][1]):
            assert float((x - y).abs().max()) < TOL


def test_eager_attention_continues_exactly_too(tiny_models):
    model, tok = load(tiny_models["chatml"], attn="eager")
    assert_same_rollouts(
        play(model, tok, turn_cache=False, sharing=False), play(model, tok, turn_cache=True, sharing=False)
    )


def test_over_budget_re_prefills_exactly_and_logs_it(tiny_models, caplog):
    model, tok = load(tiny_models["chatml"])
    today = play(model, tok, turn_cache=False, sharing=True)
    with caplog.at_level(logging.INFO, logger="llm_gym.trainer.turn_cache"):
        over = play(model, tok, turn_cache=True, sharing=True, budget=0)
    assert_same_rollouts(today, over)
    stats = over[2].stats
    assert stats.over_budget >= 2 and stats.prefill == stats.today and stats.peak_mib == 0
    assert "over turn_cache_budget_mib=0" in caplog.text


def test_the_carried_cache_ends_with_the_round(tiny_models):
    """``play_token_episodes`` releases the carried cache: the next round (new weights, maybe) starts afresh."""
    from llm_gym.trainer.chat_templates import ChatTemplateTokens
    from llm_gym.trainer.rollouts import HFGenerate, play_token_episodes

    model, tok = load(tiny_models["chatml"])
    template = ChatTemplateTokens(tok)
    gen = HFGenerate(model, tok, model.generation_config, template.stop_ids, "cpu", turn_cache=tc.TurnCache())
    seen = []
    inner = gen.__call__

    class Spy:
        def __call__(self, contexts, budgets):
            seen.append(gen._session.carried is not None)
            return inner(contexts, budgets)

        release = gen.release

    for _ in range(2):
        play_token_episodes(
            FROZEN_LAKE[0],
            [1, 1],
            Spy(),
            template,
            max_new_tokens=4,
            max_completion_length=600,
            env_kwargs=FROZEN_LAKE[1],
            group_size=2,
        )
        assert gen._session.carried is None
    assert seen == [False, True, True, False, True, True]


@pytest.mark.parametrize("budget", [None, 0])
def test_lockstep_ranks_run_the_same_forwards_every_turn(tiny_models, budget):
    """With several processes (sharded weights gather in every forward) each rank must run the same forwards:
    the first turn today's path (a prefix prefill, then ``generate``), every later turn one ``generate`` whatever
    its rows carry (budget 0: nothing is carried); the tokens are still today's."""
    from llm_gym.trainer.chat_templates import ChatTemplateTokens
    from llm_gym.trainer.rollouts import HFGenerate

    model, tok = load(tiny_models["chatml"])
    stop = ChatTemplateTokens(tok).stop_ids
    cfg = model.generation_config
    cfg.do_sample = True
    contexts = [[5, 6, 7, 8, 9, 10, 11, 12] * 3] * 4
    outs = {}
    for on in (True, False):
        gen = HFGenerate(
            model,
            tok,
            cfg,
            stop,
            "cpu",
            sharing=ps.PrefixSharing(min_saved=4),
            lockstep=True,
            turn_cache=tc.TurnCache(**({} if budget is None else {"budget_mib": budget})) if on else None,
        )
        rec = Recorder(model)
        outside, calls = [], []
        hook = model.register_forward_hook(lambda m, a, o, out=outside, r=rec: out.append(not r.inside))
        try:
            torch.manual_seed(0)
            first, _ = gen(contexts, [3] * 4)
            calls.append(sum(outside))
            outside.clear()
            # a later turn: the first row's episode ended; a dummy row (the first prompt) keeps the count
            later = [c + t + [13, 14] for c, t in zip(contexts[1:], first[1:])] + [contexts[0]]
            second, _ = gen(later, [3] * 4)
            calls.append(sum(outside))
        finally:
            hook.remove()
            rec.close()
        outs[on] = (first, second, calls)
    assert outs[True][0] == outs[False][0] and outs[True][1] == outs[False][1]
    assert outs[True][2] == [1, 0]  # one prefix prefill outside generate on the first turn, none later


# ------------------------------------------------------------------------------------------ refusals
def test_what_cannot_be_exact_is_refused_or_turned_off(caplog):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = dict(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    sliding = Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=True, sliding_window=16))
    with pytest.raises(tc.TurnCacheUnsupported, match="sliding-window"):
        tc.from_setting(True, sliding)
    with caplog.at_level(logging.WARNING):
        assert tc.from_setting(None, sliding) is None
    assert "turn cache is off" in caplog.text
    flash = Qwen2ForCausalLM(Qwen2Config(**shape))
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(tc.TurnCacheUnsupported, match="'sdpa' or 'eager'.*--use_turn_cache false"):
        tc.check_model(flash)
    assert tc.from_setting(False, Qwen2ForCausalLM(Qwen2Config(**shape))) is None
    assert isinstance(tc.from_setting(None, Qwen2ForCausalLM(Qwen2Config(**shape))), tc.TurnCache)
    # a cache it cannot extend is never carried
    from transformers.cache_utils import DynamicCache, DynamicSlidingWindowLayer

    assert tc.cache_layers(DynamicCache(config=sliding.config)) is None
    assert tc.cache_layers(object()) is None
    assert DynamicSlidingWindowLayer is not None


def test_a_generation_config_it_cannot_match_turns_it_off_for_that_round(tiny_models, caplog):
    from llm_gym.trainer.chat_templates import ChatTemplateTokens
    from llm_gym.trainer.rollouts import HFGenerate

    model, tok = load(tiny_models["chatml"])
    cfg = model.generation_config
    cfg.repetition_penalty = 1.3
    with caplog.at_level(logging.WARNING, logger="llm_gym.trainer.turn_cache"):
        gen = HFGenerate(model, tok, cfg, ChatTemplateTokens(tok).stop_ids, "cpu", turn_cache=tc.TurnCache())
    assert gen._session is None and "repetition_penalty" in caplog.text


# ------------------------------------------------------------------------------------------ the trainer
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_trainer_rows_are_unchanged_and_the_summary_counts_prefill(tiny_dir, tmp_path, checkpointing):
    """``use_turn_cache`` on by default: the training rows (prompt, completion ids, masks) of a round equal those of
    the same round without it, and the counts reach the summary line. Also with gradient checkpointing on (the
    CPU settings' default), where a model in training mode would ignore a cache it is passed unless generation
    turns checkpointing off."""
    from llm_gym.trainer.rollouts import seed_prompt

    from tests._tiny import make_tiny_trainer, tiny_run_kwargs

    kwargs = tiny_run_kwargs(
        tmp_path,
        env="CoordFrozenLake",
        env_kwargs={"success_rate": 1.0, "size": 3},
        max_turns=3,
        max_actions_per_turn=1,
        max_actions=3,
        num_prompts=2,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=400,
        max_new_tokens=6,
        filter_strategy="off",
        gradient_checkpointing=checkpointing,
    )
    tr = make_tiny_trainer(tiny_dir, kwargs)
    if checkpointing:  # what Trainer.train does before the first round
        tr.model.activation_checkpointing_enable()
    tr.model.train()
    assert tr.model.is_activation_checkpointing is checkpointing
    assert tr.args.use_turn_cache is None and isinstance(tr.turn_cache, tc.TurnCache)
    rows = [{"prompt": seed_prompt(s)} for s in (5, 5, 5, 5, 6, 6, 6, 6)]
    out = {}
    for on in (True, False):
        saved = tr.turn_cache
        tr.turn_cache = saved if on else None
        torch.manual_seed(0)
        out[on] = tr._generate_and_score_completions(rows)
        tr.turn_cache = saved
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        assert torch.equal(out[True][key], out[False][key]), key
    assert 0 < tr.turn_cache.stats.prefill < tr.turn_cache.stats.today
    assert tc.summary_line(tr.turn_cache).startswith("turn cache: generation prefill ")


def test_config_field_is_declared_and_validated(tmp_path):
    from llm_gym.trainer.config import LLMGymGRPOConfig

    from tests._tiny import tiny_config_kwargs

    with pytest.raises(ValueError, match="turn_cache_budget_mib"):
        LLMGymGRPOConfig(**tiny_config_kwargs(tmp_path, turn_cache_budget_mib=-1.0))
    cfg = LLMGymGRPOConfig(**tiny_config_kwargs(tmp_path, use_turn_cache=False))
    assert cfg.use_turn_cache is False


# ------------------------------------------------------------------------------------------ SmolLM2
@pytest.mark.slow
def test_smollm2_continues_exactly():
    """SmolLM2-135M-Instruct (float32): every step's logits within float32 noise of today's path and the same
    sampled tokens, with prefix sharing."""
    from llm_gym.trainer.models import resolve_model

    try:
        path = resolve_model("smollm2")
    except Exception as e:  # not installed offline here
        pytest.skip(f"SmolLM2 is not available: {e}")
    model, tok = load(path)
    today = play(model, tok, turn_cache=False, sharing=True, seeds=(3, 3, 7, 7))
    cached = play(model, tok, turn_cache=True, sharing=True, seeds=(3, 3, 7, 7))
    # SmolLM2's logits are ~10-30 in magnitude: float32 rounding of a different summation order is ~1e-4 there
    assert_same_rollouts(today, cached, tol=2e-3)
    assert cached[2].stats.prefill < cached[2].stats.today


@pytest.mark.slow
def test_benchmark_quick_mode_runs_and_reports_exact_results(tmp_path, capsys):
    """``benchmarks/turn_cache.py --quick``: tiny model, both paths alternating, results written where asked."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench_dir))
    spec = importlib.util.spec_from_file_location("bench_turn_cache", bench_dir / "turn_cache.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "res.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("turn cache: generation ") and "(tiny, G=4), prefill " in last
    (r,) = json.loads(out.read_text())["results"]
    assert r["same_tokens"] and r["turns_per_episode"] > 1
    assert r["prefill_per_episode_turn"] < r["prefill_per_episode_today"]
    assert r["prefill_over_unique"] < 1.05
