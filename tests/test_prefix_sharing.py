"""Shared-prefix forwards: the packed layout, its exactness against the unshared pass (log-probs, entropies,
gradients; float32, tiny models), the refusals, prefix-shared generation, and the trainer wired to it (GRPO,
Dr.GRPO, PPO with a value head and with a separate critic, gradient checkpointing, LoRA, the SNR filter's row
removal, micro-batches that split a group)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_gym.trainer import prefix_sharing as ps

TOL = 1e-5


# ------------------------------------------------------------------------------------------------ helpers
def tiny_lm(kind: str = "llama", **extra):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    shape = dict(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **extra,
    )
    model = (
        LlamaForCausalLM(LlamaConfig(**shape)) if kind == "llama" else Qwen2ForCausalLM(Qwen2Config(**shape))
    )
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model.float()


def group_batch(groups=((7, 4), (9, 3), (6, 1)), width=10, seed=0):
    """TRL's layout: per group a prompt (left-padded) repeated for its rows, each with its own completion
    (right-padded); some completions start alike (a shared first completion token)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for plen, n in groups:
        prompt = torch.randint(2, 60, (plen,), generator=g).tolist()
        for i in range(n):
            clen = 1 + (3 * i + plen) % width
            comp = ([5, 6] if i % 2 else []) + torch.randint(2, 60, (clen,), generator=g).tolist()
            rows.append((prompt, comp[:width]))
    P = max(len(p) for p, _ in rows)
    C = max(len(c) for _, c in rows)
    ids = torch.zeros(len(rows), P + C, dtype=torch.long)
    att = torch.zeros_like(ids)
    for b, (p, c) in enumerate(rows):
        ids[b, P - len(p) : P] = torch.tensor(p)
        att[b, P - len(p) : P] = 1
        ids[b, P : P + len(c)] = torch.tensor(c)
        att[b, P : P + len(c)] = 1
    return ids, att, C


def plain_logps(model, ids, att, C):
    labels = ids.masked_fill(att == 0, -100)
    labels[:, :-C] = -100
    out = model(input_ids=ids, attention_mask=att, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -C:], out.entropy[:, -C:]


def grad_of(model, fn):
    model.zero_grad(set_to_none=True)
    fn().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def max_rel(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-30)) for k in b)


# ------------------------------------------------------------------------------------------------ the layout
@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 4)), min_size=1, max_size=4),
    width=st.integers(1, 6),
    seed=st.integers(0, 1000),
    min_saved=st.integers(1, 20),
    relative=st.booleans(),
)
def test_every_scored_token_reads_the_state_of_its_own_row(groups, width, seed, min_saved, relative):
    """For each scored token: its output comes from the packed position of the row's previous token (same id,
    same position id, labelled with the token), and that position's query attends exactly the row's earlier
    tokens (same ids and positions): the packed pass computes each row's causal attention, nothing else.
    Relative positions: the same, with positions counted from each row's first token."""
    ids, att, C = group_batch(tuple(groups), width, seed)
    plan = ps.plan_packing(ids, att, C, min_saved=min_saved, relative_positions=relative)
    assert plan is not None
    assert plan.tokens <= int(att.sum())  # never more than the valid tokens
    # the query -> keys map of every packed position
    keys_of = {}
    for lv in plan.packing.levels:
        R, Q = lv.q_index.shape
        flat_q = lv.q_index.reshape(-1)[lv.q_take]
        rows_q = lv.q_take // Q
        cols_q = lv.q_take % Q
        for p, r, c in zip(flat_q.tolist(), rows_q.tolist(), cols_q.tolist()):
            keys_of[p] = sorted(lv.k_index[r][lv.mask[r, 0, c]].tolist())
    assert sorted(keys_of) == list(range(plan.tokens))  # every position is a query exactly once
    L = ids.shape[1]
    fid, fpos, flab = plan.input_ids[0], plan.position_ids[0], plan.shift_labels[0]
    for b in range(ids.shape[0]):
        shift = int(att[b].nonzero()[0]) if relative else 0
        for c in range(C):
            j = L - C + c
            if not att[b, j]:
                assert not plan.valid[b, c]
                continue
            assert plan.valid[b, c]
            p = int(plan.src[b, c])
            assert int(fid[p]) == int(ids[b, j - 1]) and int(flab[p]) == int(ids[b, j])
            assert int(fpos[p]) == j - 1 - shift
            seen = sorted((int(fpos[k]), int(fid[k])) for k in keys_of[p])
            want = [(k - shift, int(ids[b, k])) for k in range(j) if att[b, k]]
            assert seen == want


def test_layouts_the_unshared_pass_must_handle_get_no_plan():
    ids, att, C = group_batch()
    holed = att.clone()
    holed[0, -C + 1] = 0
    holed[0, -C + 2 :] = 1  # a hole inside the completion
    assert ps.plan_packing(ids, holed, C) is None
    empty_prompt = att.clone()
    empty_prompt[1, : ids.shape[1] - C] = 0  # the first scored token has no token before it
    assert ps.plan_packing(ids, empty_prompt, C) is None
    assert ps.plan_packing(ids, torch.zeros_like(att), C) is None  # no valid token at all (used to raise)


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 5)), min_size=1, max_size=5),
    batch_size=st.integers(1, 6),
    seed=st.integers(0, 1000),
)
def test_lockstep_chunks_match_the_unshared_forward_count(groups, batch_size, seed):
    """With several processes every rank must run as many chunked forwards as the unshared pass, whatever its rows
    share (a sharded model gathers its weights in each forward); without, sharing may merge chunks."""
    ids, att, _ = group_batch(tuple(groups), 4, seed)
    B = ids.shape[0]
    chunks = ps.chunk_rows(ids, att, batch_size, lockstep=True)
    assert len(chunks) == -(-B // batch_size)
    assert sorted(b for c in chunks for b in c) == list(range(B))
    assert len(ps.chunk_rows(ids, att, batch_size)) <= len(chunks)
    sharing = ps.PrefixSharing(lockstep=True)
    assert len(sharing.plans(ids, att, 1, batch_size)) == len(chunks)


def test_group_order_keeps_groups_together_and_is_a_permutation():
    prompts = torch.tensor([[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5], [0, 7, 2], [3, 4, 5]])
    mask = torch.ones_like(prompts)
    torch.manual_seed(0)
    order = ps.group_order(prompts, mask).tolist()
    assert sorted(order) == list(range(6))
    keys = [tuple(prompts[i].tolist()) for i in order]
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(runs) == len(set(keys)) == 3  # each distinct prompt is one contiguous run


# ------------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize(
    "kind, checkpointing, relative",
    [("llama", False, False), ("llama", True, True), ("qwen2", False, True), ("qwen2", True, False)],
)
def test_logps_entropies_and_gradients_equal_the_unshared_pass(kind, checkpointing, relative):
    model = tiny_lm(kind)
    ps.enable(model)
    assert ps.relative_rope(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids, att, C = group_batch()
    sharing = ps.PrefixSharing(min_saved=1, relative_positions=relative)
    ref_lp, ref_ent = plain_logps(model, ids, att, C)
    lp, ent = ps.per_token_logps(sharing, model, ids, att, C, compute_entropy=True)
    assert (lp - ref_lp).abs().max() < TOL and (ent - ref_ent).abs().max() < TOL
    assert sharing.tokens.processed < sharing.tokens.plain
    w = torch.randn(ref_lp.shape, generator=torch.Generator().manual_seed(3))
    g_plain = grad_of(model, lambda: (plain_logps(model, ids, att, C)[0] * w).sum())
    g_shared = grad_of(model, lambda: (ps.per_token_logps(sharing, model, ids, att, C)[0] * w).sum())
    assert max_rel(g_shared, g_plain) < TOL
    # chunks of a few rows' worth of tokens (TRL's old/ref log-prob chunking) give the same numbers
    lp3, _ = ps.per_token_logps(sharing, model, ids, att, C, batch_size=3)
    assert len(sharing.last) > 1 and (lp3 - ref_lp).abs().max() < TOL


def test_lora_adapter_gradients_equal_the_unshared_pass():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        tiny_lm("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    for n, p in model.named_parameters():  # B starts at zero: move it so A gets a gradient too
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    ps.enable(model)
    model.train()
    ids, att, C = group_batch()
    sharing = ps.PrefixSharing(min_saved=1)
    w = torch.randn((ids.shape[0], C), generator=torch.Generator().manual_seed(4))
    g_plain = grad_of(model, lambda: (plain_logps(model, ids, att, C)[0] * w).sum())
    g_shared = grad_of(model, lambda: (ps.per_token_logps(sharing, model, ids, att, C)[0] * w).sum())
    assert g_plain and all("lora_" in n for n in g_plain)
    assert max_rel(g_shared, g_plain) < TOL


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("impl", ["eager", "flash_attention_2", "flex_attention"])
def test_other_attention_backends_are_refused(impl):
    model = tiny_lm("llama")
    model.config._attn_implementation = impl
    with pytest.raises(ps.PrefixSharingUnsupported, match="sdpa"):
        ps.enable(model)
    with pytest.raises(ps.PrefixSharingUnsupported):
        ps.from_setting(True, model)
    assert ps.from_setting(None, model) is None  # the default: off where not exact
    assert ps.from_setting(False, tiny_lm("llama")) is None


def test_sliding_window_and_attention_dropout_are_refused():
    with pytest.raises(ps.PrefixSharingUnsupported, match="sliding"):
        ps.check_model(tiny_lm("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0))
    with pytest.raises(ps.PrefixSharingUnsupported, match="dropout"):
        ps.check_model(tiny_lm("llama", attention_dropout=0.1))


def test_mistral_default_sliding_window_turns_sharing_off_up_front():
    """Mistral's config has ``sliding_window=4096`` by default and passes it to every layer: the default setting
    must switch sharing off at the start (it used to pass the check and fail on the first training forward)."""
    from transformers import MistralConfig, MistralForCausalLM

    shape = dict(
        vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    windowed = MistralForCausalLM(MistralConfig(**shape))
    assert windowed.config.sliding_window is not None
    assert ps.from_setting(None, windowed) is None
    with pytest.raises(ps.PrefixSharingUnsupported, match="sliding"):
        ps.from_setting(True, windowed)
    assert ps.from_setting(None, MistralForCausalLM(MistralConfig(**shape, sliding_window=None))) is not None


def test_a_model_without_the_packed_attention_fails_loudly():
    """The placeholder mask leaves no room for a query: attention that is not ours errors instead of
    attending everything."""
    model = tiny_lm("llama")
    model.config._attn_implementation = "eager"
    ids, att, C = group_batch()
    plan = ps.plan_packing(ids, att, C)
    with pytest.raises(RuntimeError):
        model(**plan.model_inputs(), shift_labels=plan.shift_labels, fused_lm_head=True)


# ------------------------------------------------------------------------------------------------ generation
def test_prompt_clusters_save_the_most_tokens():
    """Groups share their whole prompt when that saves more than sharing only the system text across groups, and
    the other way round; every row keeps at least one token to generate from."""
    system = list(range(100, 275))  # 175 tokens common to every seed (Bandit's system text and instructions)

    def rows(groups, per_group, own):
        out = []
        for g in range(groups):
            prompt = system + [1000 + g] * own
            out += [prompt] * per_group
        return out

    two_big = ps.share_prompts(rows(2, 8, 45))  # 2 groups of 8: each group shares its 220 tokens
    assert len(two_big.prefixes) == 2 and all(len(p) == 219 for p in two_big.prefixes)
    # 8 groups of 2 with a tiny per-seed part: one shared system prefix
    many_small = ps.share_prompts(rows(8, 2, 3))
    assert len(many_small.prefixes) == 1 and len(many_small.prefixes[0]) == 175
    for layout in (two_big, many_small):
        assert all(len(s) >= 1 for s in layout.suffixes)
        assert layout.tokens()[0] < layout.tokens()[1]
    alone = ps.share_prompts([[1, 2, 3], [4, 5, 6]])
    assert not alone.shares and alone.suffixes == [[3], [6]]
    assert ps.share_prompts([[1], [1, 2]]) is None


def test_shared_generation_samples_the_same_tokens():
    """With the same generator seed the prefix-cached path samples the tokens the plain batched generate does
    (the logits agree to float rounding, so every draw lands on the same token)."""
    from transformers import GenerationConfig

    model = tiny_lm("llama", pad_token_id=0, eos_token_id=1).eval()
    cfg = GenerationConfig(
        do_sample=True, temperature=1.0, max_new_tokens=6, pad_token_id=0, eos_token_id=[1]
    )
    g = torch.Generator().manual_seed(0)
    p1 = torch.randint(2, 60, (20,), generator=g).tolist()
    p2 = torch.randint(2, 60, (25,), generator=g).tolist()
    contexts = [p1] * 3 + [p2 + [5, 6]] * 3 + [p2 + [7], [9, 8, 7]]
    layout = ps.share_prompts(contexts, min_shared=8)
    assert layout.shares and len(layout.prefixes) == 3
    shared_tokens, plain_tokens = layout.tokens()
    assert shared_tokens < plain_tokens
    width = max(len(c) for c in contexts)
    ids = torch.zeros(len(contexts), width, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, c in enumerate(contexts):
        ids[i, width - len(c) :] = torch.tensor(c)
        att[i, width - len(c) :] = 1
    last_logits: list[torch.Tensor] = []
    hook = model.register_forward_hook(lambda m, i, out: last_logits.append(out.logits[:, -1].detach()))
    try:
        for seed in range(3):
            last_logits.clear()
            torch.manual_seed(seed)
            plain = model.generate(input_ids=ids, attention_mask=att, generation_config=cfg)[:, width:]
            plain_logits = list(last_logits)
            last_logits.clear()
            torch.manual_seed(seed)
            shared = ps.generate_shared(model, layout, cfg, 0, "cpu")
            assert torch.equal(plain, shared)
            # every step's next-token logits agree (the shared path's first forward is the prefixes' prefill):
            # token identity alone would miss e.g. a position offset that moves the logits a little
            shared_logits = last_logits[1:]
            assert len(shared_logits) == len(plain_logits)
            for a, b in zip(plain_logits, shared_logits):
                assert (a - b).abs().max() < TOL
    finally:
        hook.remove()


# ------------------------------------------------------------------------------------------------ the trainer
def trainer_for(tiny_dir, tmp_path, trainer_cls=None, trainer_kwargs=None, **overrides):
    from tests._tiny import make_tiny_trainer, tiny_run_kwargs

    kwargs = tiny_run_kwargs(
        tmp_path,
        env="FrozenLake",
        env_kwargs={"max_turns": 3},
        num_prompts=2,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=64,
        max_new_tokens=6,
        filter_strategy="off",
        use_prefix_sharing=True,
    )
    kwargs.update(overrides)
    tr = make_tiny_trainer(tiny_dir, kwargs, trainer_cls=trainer_cls, **(trainer_kwargs or {}))
    tr.current_gradient_accumulation_steps = 1
    if tr.args.gradient_checkpointing:  # Trainer turns it on in train(); the loss is called directly here
        tr.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=tr.args.gradient_checkpointing_kwargs
        )
        assert tr.model.is_gradient_checkpointing
    tr.model.train()
    return tr


def scored_batch(tr, seeds=(5, 5, 5, 5, 6, 6, 6, 6)):
    from llm_gym.trainer.rollouts import seed_prompt

    torch.manual_seed(0)
    batch = tr._generate_and_score_completions([{"prompt": seed_prompt(s)} for s in seeds])
    batch["advantages"] = torch.linspace(-1.0, 1.0, batch["completion_ids"].shape[0])  # a signal on every row
    return batch


def loss_grads(tr, batch, shared: bool, sharing):
    tr.prefix_sharing = sharing if shared else None
    try:
        return grad_of(tr.model, lambda: tr.compute_loss(tr.model, batch))
    finally:
        tr.prefix_sharing = sharing


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # TRL's default loss (dapo)
        {"loss_type": "dr_grpo"},
        {"loss_type": "grpo", "gradient_checkpointing": True},
        {"loss_agg_mode": "seq-mean-token-sum", "dual_clip": 3.0},  # llm-gym's own policy loss
    ],
)
def test_grpo_loss_gradients_equal_the_unshared_pass(tiny_dir, tmp_path, overrides):
    tr = trainer_for(tiny_dir, tmp_path, **overrides)
    sharing = tr.prefix_sharing
    assert isinstance(sharing, ps.PrefixSharing)
    batch = scored_batch(tr)
    before = sharing.tokens.processed
    g_shared = loss_grads(tr, batch, True, sharing)
    assert sharing.tokens.processed > before  # the loss pass went through the packed forward
    g_plain = loss_grads(tr, batch, False, sharing)
    assert max_rel(g_shared, g_plain) < TOL


@pytest.mark.parametrize(
    "overrides, lora", [({"beta": 0.1}, False), ({"beta": 0.1}, True), ({"num_iterations": 2}, False)]
)
def test_reference_and_old_logps_equal_the_unshared_pass(tiny_dir, tmp_path, overrides, lora):
    """TRL's reference log-probs (a separate reference model; with LoRA the adapter-disabled policy) and old
    log-probs (``num_iterations > 1``), computed in chunks during scoring, go through the packed pass exactly."""
    from llm_gym.trainer.rollouts import seed_prompt

    kwargs = {}
    if lora:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    tr = trainer_for(tiny_dir, tmp_path, trainer_kwargs=kwargs, per_device_train_batch_size=4, **overrides)
    for n, p in tr.model.named_parameters():  # LoRA B starts at zero: move it so the adapter matters
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    sharing = tr.prefix_sharing
    rows = [{"prompt": seed_prompt(s)} for s in (5, 5, 5, 5, 6, 6, 6, 6)]
    out = {}
    for shared in (True, False):
        tr.prefix_sharing = sharing if shared else None
        torch.manual_seed(0)
        before = sharing.tokens.processed
        out[shared] = tr._generate_and_score_completions(rows)
        assert (sharing.tokens.processed > before) == shared
    tr.prefix_sharing = sharing
    assert torch.equal(out[True]["completion_ids"], out[False]["completion_ids"])
    key = "ref_per_token_logps" if "beta" in overrides else "old_per_token_logps"
    mask = out[False]["completion_mask"].bool()
    assert (out[True][key] - out[False][key])[mask].abs().max() < TOL
    if lora:  # the reference really is the adapter-disabled model, not the policy
        ids = torch.cat([out[True]["prompt_ids"], out[True]["completion_ids"]], dim=1)
        attn = torch.cat([out[True]["prompt_mask"], out[True]["completion_mask"]], dim=1)
        with torch.no_grad():
            policy = tr._get_per_token_logps_and_entropies(tr.model, ids, attn, mask.shape[1])[0]
        assert (policy - out[True][key])[mask].abs().max() > 1e-3


@pytest.mark.parametrize("critic, checkpointing", [("head", True), ("separate", False)])
def test_ppo_values_and_gradients_equal_the_unshared_pass(tiny_dir, tmp_path, critic, checkpointing):
    from llm_gym.trainer.algorithms import algorithm_overrides
    from llm_gym.trainer.ppo import OLD_VALUES, LLMGymPPOTrainer

    tr = trainer_for(
        tiny_dir,
        tmp_path,
        trainer_cls=LLMGymPPOTrainer,
        critic_model=critic,
        gradient_checkpointing=checkpointing,
        **algorithm_overrides("ppo"),
    )
    sharing = tr.prefix_sharing
    from llm_gym.trainer.rollouts import seed_prompt

    torch.manual_seed(0)
    tr.prefix_sharing = None
    plain = tr._generate_and_score_completions([{"prompt": seed_prompt(s)} for s in (5, 5, 5, 5, 6, 6, 6, 6)])
    tr.prefix_sharing = sharing
    rewards = torch.linspace(0.0, 1.0, 8)
    with torch.no_grad():
        shared_batch = tr.compute_advantages(dict(plain), rewards)
        tr.prefix_sharing = None
        plain_batch = tr.compute_advantages(dict(plain), rewards)
        tr.prefix_sharing = sharing
    mask = (plain["completion_mask"] * plain["tool_mask"]).bool()
    assert (shared_batch[OLD_VALUES] - plain_batch[OLD_VALUES])[mask].abs().max() < TOL
    g_shared = loss_grads(tr, plain_batch, True, sharing)
    g_plain = loss_grads(tr, plain_batch, False, sharing)
    critic_params = [n for n in g_plain if "v_head" in n or "critic" in n]
    assert critic_params and max_rel(g_shared, g_plain) < TOL


def test_snr_row_removal_and_padding_copies_stay_exact(tiny_dir, tmp_path):
    from llm_gym.trainer.batch import select_rows

    tr = trainer_for(tiny_dir, tmp_path)
    sharing = tr.prefix_sharing
    batch = scored_batch(tr)
    keep = torch.tensor([True, True, True, False, False, True, False, False])
    kept, n_pad = select_rows(batch, keep, multiple=3)  # 4 kept rows padded to 6 with masked copies
    assert n_pad == 2
    assert max_rel(loss_grads(tr, kept, True, sharing), loss_grads(tr, kept, False, sharing)) < TOL


def test_micro_batches_that_split_a_group_train_exactly(tiny_dir, tmp_path):
    """Four micro-batches of two rows per round (G = 4): each holds consecutive rows of one group, shares its
    prompt within the micro-batch, and the accumulated gradient equals the unshared pass over the same ones."""
    tr = trainer_for(
        tiny_dir, tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=1
    )
    sharing = tr.prefix_sharing
    from llm_gym.trainer.rollouts import seed_prompt

    torch.manual_seed(0)
    tr._step, tr._buffered_inputs = 0, None
    first = tr._prepare_inputs([{"prompt": seed_prompt(s)} for s in (5, 5, 5, 5, 6, 6, 6, 6)])
    micro = [first] + [tr._buffered_inputs[i] for i in range(1, 4)]
    for mb in micro:  # each micro-batch is two rows of one group
        assert torch.equal(mb["prompt_ids"][0], mb["prompt_ids"][1])
        mb["advantages"] = torch.tensor([1.0, -0.5])
    total = {True: None, False: None}
    for shared in (True, False):
        acc = None
        for mb in micro:
            g = loss_grads(tr, mb, shared, sharing)
            acc = g if acc is None else {k: acc[k] + g[k] for k in acc}
        total[shared] = acc
    assert max_rel(total[True], total[False]) < TOL


def test_two_training_steps_with_sharing_move_weights_and_count_tokens(tiny_dir, tmp_path):
    def spread(completion_ids, **_):  # rewards that differ within a group, so the update is not zero
        return [float(sum(c) % 5) for c in completion_ids]

    tr = trainer_for(
        tiny_dir, tmp_path, trainer_kwargs={"reward_funcs": [spread]}, max_steps=2, learning_rate=1e-2
    )
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    moved = sum(int(not torch.equal(before[n], p)) for n, p in tr.model.named_parameters())
    assert moved > 0
    count = tr.prefix_sharing
    assert 0 < count.tokens.processed < count.tokens.plain
    assert 0 < count.generation.processed < count.generation.plain


@pytest.mark.slow
def test_two_process_ddp_gradients_equal_the_unshared_pass(tiny_dir, tmp_path):
    """Two CPU processes (gloo) under accelerate's DDP: the packed forward goes through the DDP wrapper, and the
    all-reduced gradients equal those of the unshared pass on every rank (and agree across ranks)."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(root / "trainer" / "accelerate_configs" / "ddp.yaml"),
        "--mixed_precision",
        "no",
        "--num_processes",
        "2",
        "--main_process_port",
        str(port),
        str(root / "tests" / "_prefix_ddp_worker.py"),
        "--model",
        str(tiny_dir),
        "--out",
        str(tmp_path),
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["world_size"] == 2 and r["ddp"] == "DistributedDataParallel"
        assert r["max_grad_rel_diff"] < TOL
        assert 0 < r["packed_tokens"] < r["plain_tokens"]
    assert ranks[0]["grad_digest"] == pytest.approx(ranks[1]["grad_digest"], rel=1e-9)  # all-reduced


def test_vllm_prefix_caching_is_read_from_the_colocated_engine():
    from types import SimpleNamespace as NS

    def gen(value):
        return NS(llm=NS(llm_engine=NS(cache_config=NS(enable_prefix_caching=value))))

    assert ps.vllm_prefix_caching(gen(True)) is True
    assert ps.vllm_prefix_caching(gen(False)) is False
    nested = NS(llm=NS(llm_engine=NS(vllm_config=NS(cache_config=NS(enable_prefix_caching=True)))))
    assert ps.vllm_prefix_caching(nested) is True
    assert ps.vllm_prefix_caching(NS()) is None  # server mode: nothing to read


def test_summary_line_counts_tokens():
    sharing = ps.PrefixSharing()
    assert ps.summary_line(sharing) == "prefix sharing: no forward ran"
    sharing.tokens.add(250, 1000)
    sharing.generation.add(500, 1000)
    line = ps.summary_line(sharing)
    assert "loss pass 250 tokens vs 1,000 plain (4.00x fewer)" in line and "generation prefill 500" in line


@pytest.mark.slow
def test_benchmark_quick_mode_runs_and_reports_exact_results(tmp_path, capsys):
    """``benchmarks/prefix_sharing.py --quick``: tiny model, both settings, results written where asked."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "prefix_sharing.py"
    spec = importlib.util.spec_from_file_location("bench_prefix_sharing", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "res.json"
    assert bench.main(["--quick", "--floor", "--json", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("prefix sharing: step speed-up ") and "(Bandit, G=4), max grad rel diff" in last
    results = json.loads(out.read_text())["results"]
    assert {r["env"] for r in results} == {"Bandit", "FrozenLake"}
    for r in results:
        assert r["same_tokens"] and r["max_grad_rel_diff"] < TOL and r["max_logp_diff"] < TOL
        assert r["loss_tokens_shared"] < r["loss_tokens_plain"]
        assert (
            0 <= r["floor_grad_rel_diff"] < TOL and 0 <= r["floor_logp_diff"] < TOL
        )  # the plain pass vs itself


@pytest.mark.slow
def test_mechanism_benchmark_quick_mode_agrees_with_the_plain_pass(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "prefix_mechanisms.py"
    spec = importlib.util.spec_from_file_location("bench_prefix_mechanisms", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[-4:]
    assert [ln.split()[0] for ln in lines] == ["plain", "KV", "dense", "prefix"]
    for line in lines:
        assert (
            abs(float(line.rsplit(" ", 1)[1])) < 1e-3
        )  # the summed log-prob of every variant is the plain one
