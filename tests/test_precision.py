"""``llm_gym.trainer.precision``: float32 master weights on every path.

The decision table (CPU, one GPU, DDP, FSDP, DeepSpeed; LoRA base and adapters; separate critic; value head; the
bfloat16 opt-in and its warning), the backend detection, the config field, and end to end on the tiny model:
``llmgym-train``'s loading path (:func:`load_for_training`, asked for the GPU decision) gives float32 weights
whose one AdamW step at lr 1e-6 changes nearly every trainable element, where the opt-in's bfloat16 weights keep
almost all of them."""

import itertools
from types import SimpleNamespace

import pytest
from llm_gym.trainer.precision import (
    BACKENDS,
    ROLES,
    WEIGHT_DTYPES,
    announce,
    backend_of,
    changed_fraction,
    decide_precision,
    distributed_backend,
    trainable_dtypes,
    trainable_snapshot,
)


def cfg(**kw):
    base = dict(
        dtype="float32", bf16=True, fp16=False, use_cpu=False, use_peft=False, lora_modules_to_save=None
    )
    return SimpleNamespace(**{**base, **kw})


# ------------------------------------------------------------------------------------------ the decision
@pytest.mark.parametrize(
    ("gpu", "backend", "use_cpu"),
    [(False, "none", True), (True, "none", False), (True, "ddp", False), (False, "ddp", True)],
)
def test_default_is_float32_weights_with_bf16_autocast(gpu, backend, use_cpu):
    p = decide_precision(cfg(use_cpu=use_cpu), gpu=gpu, backend=backend)
    assert (p.load, p.params, p.master, p.compute) == ("float32", "float32", "float32", "bfloat16")
    assert p.keeps_updates and p.warning is None and p.frozen is None
    assert ("CPU" if use_cpu or not gpu else "GPU") in p.reason and "autocast" in p.reason
    no_amp = decide_precision(cfg(bf16=False, use_cpu=use_cpu), gpu=gpu, backend=backend)
    assert no_amp.compute == "float32" and "no autocast" in no_amp.reason


def test_the_opt_in_keeps_bf16_weights_and_warns_what_it_loses():
    p = decide_precision(cfg(dtype="bfloat16"), gpu=True, backend="ddp")
    assert (p.load, p.params, p.master) == ("bfloat16",) * 3
    assert not p.keeps_updates
    assert "no float32 master copy" in p.warning and "lr 1e-6" in p.warning and "%" in p.warning
    with pytest.warns(UserWarning, match="rounded away"):
        announce(p, log=None)
    lines = []
    announce(decide_precision(cfg(), gpu=True), log=lines.append)  # the default: a line, no warning
    assert len(lines) == 1 and "trained as float32" in lines[0]


def test_fsdp_is_loaded_in_float32_so_accelerates_upcast_has_nothing_to_cast():
    p = decide_precision(cfg(), gpu=True, backend="fsdp")
    assert (p.load, p.params, p.master, p.compute) == ("float32", "float32", "float32", "bfloat16")
    assert "nothing left to cast" in p.reason
    # the opt-in under FSDP with mixed precision: accelerate upcasts the trainable weights, no update is lost
    opt = decide_precision(cfg(dtype="bfloat16"), gpu=True, backend="fsdp")
    assert (opt.load, opt.params, opt.master) == ("bfloat16", "float32", "float32") and opt.warning is None
    # without mixed precision accelerate casts nothing: the opt-in trains bfloat16
    bare = decide_precision(cfg(dtype="bfloat16", bf16=False), gpu=True, backend="fsdp")
    assert bare.params == bare.master == "bfloat16" and bare.warning


def test_deepspeed_casts_to_bf16_itself_and_keeps_float32_master_weights():
    for dtype in WEIGHT_DTYPES:
        p = decide_precision(cfg(dtype=dtype), gpu=True, backend="deepspeed")
        assert (p.load, p.params, p.master) == (dtype, "bfloat16", "float32") and p.warning is None
        assert "master weights" in p.reason
    bare = decide_precision(cfg(dtype="bfloat16", bf16=False), gpu=True, backend="deepspeed")
    assert bare.master == "bfloat16" and bare.warning
    assert decide_precision(cfg(bf16=False), gpu=True, backend="deepspeed").params == "float32"


def test_lora_base_may_be_bf16_and_the_adapters_stay_float32():
    base = decide_precision(cfg(use_peft=True), gpu=True)
    assert (base.load, base.frozen, base.params, base.master) == ("float32",) * 4
    opt = decide_precision(cfg(use_peft=True, dtype="bfloat16"), gpu=True)
    assert (opt.load, opt.frozen, opt.params, opt.master) == ("bfloat16", "bfloat16", "float32", "float32")
    assert opt.warning is None and "autocast_adapter_dtype" in opt.reason
    # modules_to_save are full copies PEFT does not upcast: on bf16 they lose updates
    saved = decide_precision(cfg(use_peft=True, dtype="bfloat16", lora_modules_to_save=["lm_head"]), gpu=True)
    assert saved.master == "bfloat16" and "lm_head" in saved.warning
    ds = decide_precision(cfg(use_peft=True), gpu=True, backend="deepspeed")
    assert ds.frozen == "bfloat16" and ds.master == "float32"
    fsdp = decide_precision(
        cfg(use_peft=True, dtype="bfloat16", lora_modules_to_save=["lm_head"]), gpu=True, backend="fsdp"
    )
    assert fsdp.params == fsdp.master == "float32" and fsdp.frozen == "bfloat16"
    # an adapter folder as --model is LoRA even without use_peft
    assert decide_precision(cfg(dtype="bfloat16"), gpu=True, lora=True).frozen == "bfloat16"


def test_critic_follows_the_policy_and_the_value_head_is_float32():
    for backend, dtype in itertools.product(BACKENDS, WEIGHT_DTYPES):
        policy = decide_precision(cfg(dtype=dtype), gpu=True, backend=backend)
        critic = decide_precision(cfg(dtype=dtype), gpu=True, backend=backend, role="critic")
        assert (critic.load, critic.params, critic.master) == (policy.load, policy.params, policy.master)
        assert "critic" in critic.reason
        head = decide_precision(cfg(dtype=dtype), gpu=True, backend=backend, role="value_head")
        assert head.load == head.master == "float32" and head.warning is None
        assert head.params == ("bfloat16" if backend == "deepspeed" else "float32")
    with pytest.raises(ValueError, match="LoRA"):
        decide_precision(cfg(use_peft=True), gpu=True, role="critic")


def test_every_path_keeps_updates_by_default_and_warns_exactly_when_it_does_not():
    for gpu, backend, lora, bf16, dtype, role, saved in itertools.product(
        (False, True), BACKENDS, (False, True), (False, True), WEIGHT_DTYPES, ROLES, (None, ["lm_head"])
    ):
        if lora and role == "critic":
            continue
        c = cfg(dtype=dtype, bf16=bf16, use_peft=lora, lora_modules_to_save=saved)
        p = decide_precision(c, gpu=gpu, backend=backend, role=role)
        assert (p.warning is not None) == (not p.keeps_updates)
        if dtype == "float32":
            assert p.keeps_updates, (gpu, backend, lora, bf16, role)
            assert p.load == "float32"
        assert p.load in WEIGHT_DTYPES and p.params in ("float32", "bfloat16")


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="dtype must be one of"):
        decide_precision(cfg(dtype="float16"), gpu=True)
    with pytest.raises(ValueError, match="backend"):
        decide_precision(cfg(), gpu=True, backend="megatron")
    with pytest.raises(ValueError, match="role"):
        decide_precision(cfg(), gpu=True, role="reference")
    assert decide_precision(cfg(dtype=None), gpu=True).load == "float32"  # unset: the default


# ------------------------------------------------------------------------------------------ backend
def test_backend_from_the_launcher_or_the_config():
    assert distributed_backend(None, {}) == "none"
    assert distributed_backend(None, {"WORLD_SIZE": "4"}) == "ddp"
    assert distributed_backend(None, {"WORLD_SIZE": "4", "ACCELERATE_USE_FSDP": "true"}) == "fsdp"
    assert distributed_backend(None, {"ACCELERATE_USE_DEEPSPEED": "True"}) == "deepspeed"
    assert distributed_backend(SimpleNamespace(deepspeed="ds.json", fsdp=""), {}) == "deepspeed"
    assert distributed_backend(SimpleNamespace(deepspeed=None, fsdp=["full_shard"]), {}) == "fsdp"
    assert distributed_backend(None, {"WORLD_SIZE": "x"}) == "none"

    def acc(kind):
        return SimpleNamespace(distributed_type=SimpleNamespace(value=kind))

    assert [backend_of(acc(k)) for k in ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED")] == [
        "none",
        "ddp",
        "fsdp",
        "deepspeed",
    ]


# ------------------------------------------------------------------------------------------ config field
def test_dtype_is_a_validated_config_field_and_a_flag(tmp_path):
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.resolve import resolve_config

    from tests._tiny import tiny_config_kwargs

    assert LLMGymGRPOConfig(**tiny_config_kwargs(tmp_path)).dtype == "float32"
    with pytest.raises(ValueError, match="dtype must be one of"):
        LLMGymGRPOConfig(**tiny_config_kwargs(tmp_path, dtype="float16"))
    args, _ = resolve_config(
        ["--env", "Bandit", "--dtype", "bfloat16", "-o", str(tmp_path)], gpu=False, log=lambda *_: None
    )
    assert args.dtype == "bfloat16"
    args, _ = resolve_config(
        ["--env", "Bandit", "--set", "dtype=bfloat16", "-o", str(tmp_path)], gpu=False, log=lambda *_: None
    )
    assert args.dtype == "bfloat16"


# ------------------------------------------------------------------------------------------ end to end
def _one_step(tiny_dir, out, **overrides):
    """One GRPO step at RAGEN's actor settings (lr 1e-6, wd 0.01, clip 1.0, constant) on the tiny model loaded the
    way ``llmgym-train`` loads it on a GPU (the decision asked with gpu=True; bf16 autocast runs on the CPU)."""
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer
    from llm_gym.trainer.precision import load_for_training

    from tests._tiny import tiny_run_kwargs

    kwargs = tiny_run_kwargs(
        out,
        bf16=True,  # autocast, as on a GPU
        max_steps=1,
        learning_rate=1e-6,
        weight_decay=0.01,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        entropy_coef=0.01,  # a gradient on every weight even when the group's rewards tie
        filter_strategy="off",  # tied rewards would skip the update
        **overrides,
    )
    config = LLMGymGRPOConfig(**kwargs)
    model, tok, precision = load_for_training(tiny_dir, config, gpu=True, environ={}, log=None)
    tr = LLMGymGRPOTrainer(model=model, args=config, processing_class=tok)
    before = trainable_snapshot(tr.model)
    tr.train()
    assert tr.state.global_step == 1
    return tr, precision, before


def test_one_step_at_lr_1e6_moves_float32_weights_and_not_bf16_ones(tiny_dir, tmp_path):
    tr, precision, before = _one_step(tiny_dir, tmp_path / "fp32")
    assert precision.load == "float32" and set(trainable_dtypes(tr.model)) == {"float32"}
    fp32 = changed_fraction(tr.model, before)
    assert fp32 > 0.9, fp32
    with pytest.warns(UserWarning, match="no float32 master copy"):
        tr, precision, before = _one_step(tiny_dir, tmp_path / "bf16", dtype="bfloat16")
    assert set(trainable_dtypes(tr.model)) == {"bfloat16"}
    bf16 = changed_fraction(tr.model, before)
    # 1.8% here (float32: 99.99%): only zero-initialised biases and the weights within ~5e-4 of zero move
    assert 0 < bf16 < 0.02, bf16


def test_lora_base_in_bf16_trains_float32_adapters(tiny_dir, tmp_path):
    lora = dict(
        use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules=["q_proj", "v_proj"]
    )
    tr, precision, before = _one_step(tiny_dir, tmp_path / "lora", dtype="bfloat16", **lora)
    assert precision.frozen == "bfloat16" and precision.master == "float32"
    assert set(trainable_dtypes(tr.model)) == {"float32"}
    frozen = {str(p.dtype) for p in tr.model.parameters() if not p.requires_grad}
    assert frozen == {"torch.bfloat16"}
    # LoRA's B starts at zero, so A gets no gradient on the first step: B moves, element by element
    b = {n: t for n, t in before.items() if "lora_B" in n}
    assert b and changed_fraction(tr.model, b) > 0.9


def test_changed_fraction_counts_elements(tiny_dir):
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(4, 2)
    snap = trainable_snapshot(lin)
    with torch.no_grad():
        lin.weight[0, 0] += 1.0
    assert changed_fraction(lin, snap) == 1 / 10
    with pytest.raises(ValueError):
        changed_fraction(lin, {})


def test_update_precision_benchmark_quick_mode(capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import update_precision

    rows = update_precision.run(update_precision.argparse.Namespace(quick=True, model=None, lr=[1e-6]))
    (row,) = rows
    assert row["lr"] == 1e-6 and row["float32_changed"] > 0.99 and 0 < row["bfloat16_changed"] < 0.05
    assert row["mean_abs_change_ratio"] > 10
    assert "tiny Qwen2" in update_precision.format_rows(rows)


def test_ragen2_profile_trains_float32_weights_with_bf16_autocast(tmp_path):
    from llm_gym.trainer.resolve import resolve_config

    args, _ = resolve_config(
        ["--env", "Sokoban", "--profile", "ragen2", "-o", str(tmp_path)],
        gpu=True,
        dry_run=True,
        log=lambda *_: None,
    )
    assert args.dtype == "float32"  # veRL's model_dtype fp32 for actor and critic
    merged = SimpleNamespace(**{**vars(args), "bf16": True, "use_cpu": False})  # the GPU settings
    for role in ("policy", "critic", "value_head"):
        p = decide_precision(merged, gpu=True, backend="none", role=role)
        assert (p.load, p.master, p.compute) == ("float32", "float32", "bfloat16"), role


# ------------------------------------------------------------------------------------------ a model handed over
def test_upcast_trainable_casts_only_trainable_16_bit_weights_when_the_decision_is_float32():
    torch = pytest.importorskip("torch")
    from llm_gym.trainer.precision import upcast_trainable

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to(torch.bfloat16)
    net[0].requires_grad_(False)  # a frozen base keeps its dtype
    names = upcast_trainable(net, decide_precision(cfg(), gpu=True))
    assert names == ["1.weight", "1.bias"]
    assert net[1].weight.dtype == torch.float32 and net[0].weight.dtype == torch.bfloat16
    opt_in = torch.nn.Linear(4, 2).to(torch.bfloat16)
    assert upcast_trainable(opt_in, decide_precision(cfg(dtype="bfloat16"), gpu=True)) == []
    assert opt_in.weight.dtype == torch.bfloat16
    # DeepSpeed casts to bf16 itself and keeps float32 masters: nothing to do here
    ds = torch.nn.Linear(4, 2).to(torch.bfloat16)
    assert upcast_trainable(ds, decide_precision(cfg(), gpu=True, backend="deepspeed")) == []


def test_a_bf16_model_handed_to_the_trainer_trains_float32_weights(tiny_dir, tmp_path, caplog):
    """From Python a model may reach the trainer already in bfloat16 (not through ``load_for_training``): the
    trainer applies the same decision, so the default dtype still means float32 master weights."""
    torch = pytest.importorskip("torch")
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.grpo import LLMGymGRPOTrainer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests._tiny import tiny_config_kwargs

    tok = AutoTokenizer.from_pretrained(tiny_dir)

    def build(out, **kw):
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.bfloat16)
        config = LLMGymGRPOConfig(**tiny_config_kwargs(tmp_path / out, bf16=True, **kw))
        return LLMGymGRPOTrainer(model=model, args=config, processing_class=tok)

    with caplog.at_level("WARNING", logger="llm_gym.trainer.precision"):
        tr = build("default")
    assert set(trainable_dtypes(tr.model)) == {"float32"}
    assert "upcast to float32" in caplog.text
    # the opt-in keeps the 16-bit weights it asked for
    assert set(trainable_dtypes(build("opt_in", dtype="bfloat16").model)) == {"bfloat16"}
    # LoRA: the frozen base stays bfloat16, the trainable weights are float32
    lora = build("lora", use_peft=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"])
    assert set(trainable_dtypes(lora.model)) == {"float32"}
    assert {p.dtype for p in lora.model.parameters() if not p.requires_grad} == {torch.bfloat16}


def test_separate_critic_computes_in_bf16_autocast_in_rollouts_and_in_the_loss(tiny_dir, tmp_path):
    """The critic is called outside the policy's prepared (autocast) forward, in the rollout-time values and in
    the loss; with bf16 both run bf16 autocast on its float32 weights, like the policy (CPU autocast here)."""
    torch = pytest.importorskip("torch")
    from llm_gym.trainer.config import LLMGymGRPOConfig
    from llm_gym.trainer.ppo import LLMGymPPOTrainer
    from llm_gym.trainer.precision import load_for_training

    from tests._tiny import tiny_run_kwargs

    config = LLMGymGRPOConfig(
        **tiny_run_kwargs(
            tmp_path,
            bf16=True,
            use_cpu=True,
            max_steps=1,
            filter_strategy="off",
            critic_model="separate",
        )
    )
    model, tok, _ = load_for_training(tiny_dir, config, gpu=False, environ={}, log=None)
    tr = LLMGymPPOTrainer(model=model, args=config, processing_class=tok)
    assert {p.dtype for p in tr.critic.parameters()} == {torch.float32}
    seen = set()

    def hook(module, args, output):
        seen.add((torch.is_grad_enabled(), output.dtype))

    tr.critic.body.layers[0].mlp.down_proj.register_forward_hook(hook)
    tr.train()
    assert seen == {(False, torch.bfloat16), (True, torch.bfloat16)}  # rollout values, loss
