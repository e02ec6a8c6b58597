"""The private TRL / transformers members the trainer relies on (``llm_gym.trainer.compat``), checked against the
installed TRL and transformers one by one, so an upgrade that renames or reshapes one fails a test named after
it; and no trainer module but ``compat`` touches one."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from llm_gym.trainer import compat  # noqa: E402
from llm_gym.trainer.grpo import LLMGymGRPOTrainer  # noqa: E402
from llm_gym.trainer.ppo import LLMGymPPOTrainer  # noqa: E402

from tests._tiny import make_tiny_trainer, tiny_run_kwargs  # noqa: E402

TRAINER = Path(__file__).resolve().parents[1] / "trainer"
#: Modules whose code runs on trainer objects (the subclasses, and the glue handed the trainer).
#: Every trainer module but compat.py itself (and the model-config data folder)
TRAINER_SIDE = tuple(sorted(p.name for p in TRAINER.glob("*.py") if p.name != "compat.py"))


def _owner(path: str) -> type:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _parameters(func) -> list[str]:
    return [p for p in inspect.signature(func).parameters if p != "self"]


@pytest.mark.parametrize("name", sorted(compat.OVERRIDES))
def test_overridden_private_method_still_exists_with_our_parameters(name):
    owner, params = compat.OVERRIDES[name]
    base = getattr(_owner(owner), name, None)
    assert base is not None, f"{owner}.{name} is gone: update compat.OVERRIDES and our override"
    assert _parameters(base)[: len(params)] == list(params), f"{owner}.{name}{inspect.signature(base)}"
    ours = vars(LLMGymGRPOTrainer).get(name) or vars(LLMGymPPOTrainer).get(name)
    assert ours is not None, f"compat.OVERRIDES lists {name}, which neither trainer overrides"
    assert _parameters(ours)[: len(params)] == list(params)


@pytest.mark.parametrize("name", compat.TRAINER_ATTRIBUTES)
def test_private_attribute_is_still_set_by_grpo_trainer(name):
    from trl import GRPOTrainer

    assert re.search(rf"self\.{name}\s*=", inspect.getsource(GRPOTrainer.__init__)), name


def test_private_per_token_logps_method_keeps_its_parameters():
    from trl import GRPOTrainer

    params = _parameters(GRPOTrainer._get_per_token_logps_and_entropies)
    assert params[:4] == ["model", "input_ids", "attention_mask", "logits_to_keep"]
    assert {"batch_size", "compute_entropy"} <= set(params)


def test_private_output_dir_method_keeps_its_parameter():
    from transformers import Trainer

    assert _parameters(Trainer._get_output_dir) == ["trial"]


@pytest.fixture(scope="module")
def trainer(tiny_dir, tmp_path_factory):
    kwargs = tiny_run_kwargs(tmp_path_factory.mktemp("compat"), num_prompts=2, num_generations=2, max_steps=1)
    return make_tiny_trainer(tiny_dir, kwargs)


def test_private_trainer_state_reads_as_compat_says(trainer):
    # _metrics: per mode, a list per key
    compat.metrics(trainer, "train")["x"].append(1.0)
    assert compat.metrics(trainer, "train")["x"] == [1.0] and compat.metrics(trainer, "eval") is not None
    assert compat.micro_step(trainer) == 0  # _step
    assert compat.buffered_inputs(trainer) is None  # _buffered_inputs before the first round
    compat.set_buffered_inputs(trainer, [{"a": 1}])
    assert compat.buffered_inputs(trainer) == [{"a": 1}]
    compat.set_buffered_inputs(trainer, None)
    backend = compat.distributed_backend(trainer)  # _dist
    assert backend is not None and callable(backend.summon_full_params)
    assert compat.run_output_dir(trainer, None) == trainer.args.output_dir  # _get_output_dir


def test_private_per_token_logps_method_returns_logps_and_entropies(trainer):
    ids = torch.randint(5, 50, (2, 7))
    logps, entropies, _ = compat.per_token_logps_and_entropies(
        trainer, trainer.model, ids, torch.ones_like(ids), 3, batch_size=2, compute_entropy=True
    )
    assert logps.shape == entropies.shape == (2, 3) and bool((logps <= 0).all())


def test_private_keys_to_ignore_on_save_keeps_weights_out_of_save_pretrained(tiny_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    model.extra = torch.nn.Linear(2, 1)
    compat.ignore_on_save(model, {"extra.weight", "extra.bias"})
    model.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert saved and not [k for k in saved if k.startswith("extra.")]


def _trl_private_names() -> set[str]:
    import transformers.modeling_utils
    import transformers.trainer
    import trl.trainer.grpo_trainer

    names: set[str] = set()
    for module in (trl.trainer.grpo_trainer, transformers.trainer, transformers.modeling_utils):
        src = inspect.getsource(module)
        names |= set(re.findall(r"def (_[a-z]\w*)", src))
        names |= set(re.findall(r"self\.(_[a-z]\w*)\s*=", src))
    return names


def _class_members(cls: ast.ClassDef) -> set[str]:
    """Names a class defines: its methods and the ``self.X = ...`` attributes its methods set."""
    names = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and ast.unparse(node.value) == "self"
        ):
            names.add(node.attr)
    return names


def test_only_compat_touches_private_trl_members():
    private = _trl_private_names()
    # our trainer classes and their mixins; other classes (a policy, a report) may name their own members freely
    ours = {c.__name__ for t in (LLMGymGRPOTrainer, LLMGymPPOTrainer) for c in t.__mro__}
    for file in TRAINER_SIDE:
        tree = ast.parse((TRAINER / file).read_text(encoding="utf-8"))
        classes = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        own = set().union(*(_class_members(c) for c in classes if c.name not in ours))
        overridden = set()
        for node in (f for c in classes if c.name in ours for f in c.body):
            if isinstance(node, ast.FunctionDef) and node.name in private:
                assert node.name in compat.OVERRIDES, f"{file}: {node.name} overrides a private TRL member"
                decorators = [ast.unparse(d) for d in node.decorator_list]
                assert "compat.overrides" in decorators, f"{file}: mark {node.name} @compat.overrides"
                overridden.add(node.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private - own:
                # only our own overrides, through self or super()
                receiver = ast.unparse(node.value)
                ok = node.attr in overridden and receiver in ("self", "super()")
                assert ok, f"{file}: {receiver}.{node.attr} bypasses trainer/compat.py"


def test_an_unlisted_private_override_is_refused():
    with pytest.raises(TypeError, match="not a private TRL/transformers method listed"):

        @compat.overrides
        def _training_step(self):  # pragma: no cover - never called
            pass
