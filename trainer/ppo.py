"""``LLMGymPPOTrainer``: PPO with a critic, plugged into the GRPO trainer's ``compute_advantages`` hook.

TRL removed its own ``PPOTrainer`` in 1.13; this one is a subclass of
:class:`llm_gym.trainer.grpo.LLMGymGRPOTrainer` that overrides its documented hook and Trainer's usual ones:

- a value head ``v_head = Linear(hidden, 1)`` is attached to the policy's causal-LM module, so the Trainer's
  optimizer, DDP and checkpoints see it; it gets its own optimizer parameter group with ``value_lr``
  (:meth:`create_optimizer`);
- a forward hook on the backbone turns the last hidden state into values during the loss forward TRL already
  runs (no extra forward in the loss); one no-grad forward per generation round gives the rollout-time values;
- :meth:`compute_advantages` (the hook, called before the SNR filter, or after it with
  ``advantages_after_filter``) puts the episode reward on the last model token, runs GAE over model tokens
  only (environment tokens are transparent) and replaces TRL's group advantages with the (B, T) ones,
  whitened with the mean and std of every process's rows (one all-reduce of the moments, as veRL whitens
  the global batch; pure math: :func:`llm_gym.trainer.gae.ppo_targets`); the per-row value targets travel
  with their rows through the filter. TRL's clipped surrogate, ``loss_type``, ``epsilon``/``epsilon_high``,
  ``num_iterations`` and KL all apply;
- :meth:`compute_loss` adds the clipped value loss times ``vf_coef`` to TRL's loss;
- the value head is saved as ``value_head.safetensors`` next to the weights (and kept out of
  ``save_pretrained``'s output), and restored on ``resume_from_checkpoint``;
- with PEFT the hook goes on the base model's backbone and the value head stays trainable.

With ``critic_model="separate"`` the critic is a full model instead (RAGEN / veRL: ``critic.model.path`` is the
policy's, ``config/base.yaml``): :class:`ValueModel`, a copy of the policy's backbone at initialisation with its
own value head, attached to the causal LM as ``critic`` so the Trainer's optimizer and accelerate see it, in its
own parameter group (``value_lr``, ``critic_weight_decay``), saved as ``critic.safetensors``. It runs its own
forward for the rollout-time values and in the loss, and its gradients are clipped apart from the actor's
(:meth:`LLMGymPPOTrainer._clip_grad_norm`).

The PPO loss follows Schulman et al. 2017 (arXiv:1707.06347), GAE Schulman et al. 2016 (arXiv:1506.02438).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
from llm_gym.trainer import compat
from llm_gym.trainer.batch import loss_mask
from llm_gym.trainer.gae import clipped_value_loss, ppo_targets
from llm_gym.trainer.grpo import LLMGymGRPOTrainer
from torch import nn

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
CRITIC_FILE = "critic.safetensors"
#: Keys of the per-row tensors PPO adds to a scored generation batch.
OLD_VALUES, RETURNS, VALUE_MASK = "ppo_old_values", "ppo_returns", "ppo_value_mask"


def causal_lm(model: nn.Module) -> Any:
    """The transformers causal-LM module inside ``model`` (through PEFT and DDP/accelerate wrappers)."""
    m: Any = model
    for _ in range(4):
        if hasattr(m, "get_base_model"):  # PeftModel
            m = m.get_base_model()
        elif isinstance(getattr(m, "module", None), nn.Module):  # DDP and friends
            m = m.module
        else:
            break
    return m


def backbone(lm: Any) -> nn.Module:
    """The decoder stack whose output is the last hidden state (``lm.model`` for Llama/Qwen-style models)."""
    base = getattr(lm, "base_model", None)
    if isinstance(base, nn.Module) and base is not lm:
        return base
    if hasattr(lm, "get_decoder"):
        return lm.get_decoder()
    raise ValueError(f"cannot find the backbone of {type(lm).__name__}; PPO needs a transformers causal LM")


def attach_value_head(
    model: nn.Module, init_std: float = 1e-3, dtype: torch.dtype = torch.float32
) -> nn.Linear:
    """Attach (or return the existing) ``v_head`` on the causal LM inside ``model``; kept out of save_pretrained."""
    lm = causal_lm(model)
    if isinstance(getattr(lm, "v_head", None), nn.Linear):
        return lm.v_head
    hidden = lm.config.get_text_config().hidden_size
    ref = next(lm.parameters())
    head = nn.Linear(hidden, 1, device=ref.device, dtype=dtype)
    nn.init.normal_(head.weight, std=init_std)
    nn.init.zeros_(head.bias)
    lm.v_head = head
    compat.ignore_on_save(lm, {"v_head.weight", "v_head.bias"})
    head.requires_grad_(True)
    return head


class ValueModel(nn.Module):
    """A separate critic: a decoder backbone plus ``v_head = Linear(hidden, 1)``; ``forward`` gives (B, L) values."""

    def __init__(self, body: nn.Module, hidden: int, init_std: float = 1e-3):
        super().__init__()
        self.body = body
        ref = next(body.parameters())
        self.v_head = nn.Linear(hidden, 1, device=ref.device, dtype=torch.float32)
        nn.init.normal_(self.v_head.weight, std=init_std)
        nn.init.zeros_(self.v_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """``kwargs`` go to the backbone (``position_ids`` and the packing of a shared-prefix forward)."""
        out = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return self.v_head(hidden.to(self.v_head.weight.dtype)).squeeze(-1)


def attach_critic(model: nn.Module, init_std: float = 1e-3, dtype: torch.dtype | None = None) -> ValueModel:
    """Attach (or return the existing) separate critic ``critic`` to the causal LM inside ``model``: a deep copy of
    its backbone (the policy's initial weights, as veRL loads the critic from the policy's path) in ``dtype``
    (None: the policy's) and a fresh float32 value head; kept out of the policy's ``save_pretrained``."""
    lm = causal_lm(model)
    if isinstance(getattr(lm, "critic", None), ValueModel):
        return lm.critic
    if hasattr(model, "get_base_model") or hasattr(model, "peft_config"):
        raise ValueError("critic_model='separate' is not supported with PEFT/LoRA; use critic_model='head'")
    body = copy.deepcopy(backbone(lm))
    if dtype is not None:
        body.to(dtype)
    critic = ValueModel(body, lm.config.get_text_config().hidden_size, init_std)
    critic.requires_grad_(True)
    lm.critic = critic
    compat.ignore_on_save(lm, {f"critic.{k}" for k in critic.state_dict()})
    return critic


class LLMGymPPOTrainer(LLMGymGRPOTrainer):
    """PPO with a value head and GAE over model tokens, on llm-gym's multi-turn rollouts.

    Accepts everything :class:`llm_gym.trainer.grpo.LLMGymGRPOTrainer` does; the critic settings come from the
    config's PPO fields (``vf_coef``, ``value_lr``, ``value_clip``, ``gae_gamma``, ``gae_lambda``,
    ``whiten_advantages``, ``value_head_init_std``, ``value_detach_backbone``).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._value_buffer: list[torch.Tensor] | None = None
        self._critic: ValueModel | None = None
        if self.args.critic_model == "separate":
            dtype = self._precision("critic").load  # float32 master weights, as the policy's (precision.py)
            self._critic = attach_critic(self.model, self.args.value_head_init_std, getattr(torch, dtype))
            self._v_head = self._critic.v_head
        else:
            dtype = self._precision("value_head").load
            self._v_head = attach_value_head(self.model, self.args.value_head_init_std, getattr(torch, dtype))
            backbone(causal_lm(self.model)).register_forward_hook(self._value_hook)

    def _precision(self, role: str) -> Any:
        from llm_gym.trainer.precision import decide_for_trainer

        return decide_for_trainer(self.args, self.accelerator, role=role)

    @property
    def critic(self) -> ValueModel | None:
        """The separate critic model (``critic_model="separate"``), else None."""
        return self._critic

    def _critic_parameters(self) -> list[nn.Parameter]:
        return list((self._critic or self._v_head).parameters())

    def _critic_values(
        self, ids: torch.Tensor, attn: torch.Tensor, P: int, C: int, chunk: int
    ) -> torch.Tensor:
        """Values of the states before each completion token from the separate critic, ``chunk`` rows a forward
        (shared-prefix forwards when prefix sharing is on)."""
        critic = self._critic
        assert critic is not None  # critic_model="separate"
        sharing = self.prefix_sharing
        chunks = sharing.plans(ids, attn, C, chunk) if sharing is not None else None
        if sharing is not None and chunks is not None:
            return sharing.run(
                lambda plan: critic(**plan.model_inputs(ids.device)), chunks, ids.size(0)
            ).float()
        parts = [
            critic(ids[i : i + chunk], attn[i : i + chunk])[:, P - 1 : P - 1 + C]
            for i in range(0, ids.size(0), chunk)
        ]
        return torch.cat(parts, dim=0).float()

    @property
    def value_head(self) -> nn.Linear:
        """The critic's ``Linear(hidden, 1)`` head (also reachable as ``v_head`` on the causal LM)."""
        return self._v_head

    # ------------------------------------------------------------------------------------------ values
    def _value_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._value_buffer is None:  # only while we ask for values (not in generate, ref or MI forwards)
            return
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        if self.args.value_detach_backbone:
            hidden = hidden.detach()
        head = self._v_head
        self._value_buffer.append(head(hidden.to(head.weight.dtype)).squeeze(-1))

    @contextlib.contextmanager
    def _capturing_values(self) -> Iterator[list[torch.Tensor]]:
        self._value_buffer = []
        try:
            yield self._value_buffer
        finally:
            self._value_buffer = None

    def _rollout_values(self, out: dict) -> torch.Tensor:
        """V(s_t) for every completion position from one no-grad forward (chunked like TRL's old log-probs)."""
        P, C = out["prompt_ids"].size(1), out["completion_ids"].size(1)
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attn = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        if self._critic is not None:
            # the critic is called directly, outside the prepared model's autocast forward: bf16 compute on the
            # float32 weights, as in the loss (compute_loss)
            with self.accelerator.autocast():
                return self._critic_values(ids, attn, P, C, self.args.per_device_train_batch_size)
        with self._capturing_values() as buf:
            compat.per_token_logps_and_entropies(
                self, self.model, ids, attn, C, batch_size=self.args.per_device_train_batch_size
            )
        return self.completion_positions(buf, P, C).float()

    # ------------------------------------------------------------------------------------------ the hook
    @torch.no_grad()
    def compute_advantages(self, batch: dict, rewards: torch.Tensor) -> dict:
        """GAE advantages from rollout-time values (the GRPO trainer's documented hook).

        Adds the per-row value targets (``ppo_old_values``, ``ppo_returns``, ``ppo_value_mask``) so the SNR
        filter keeps them with their rows. An unscorable sample (NaN reward) gets no advantage and no value
        loss: it has no reward to learn from.
        """
        values = self._rollout_values(batch)
        targets = ppo_targets(
            rewards,
            values,
            loss_mask(batch),
            gamma=self.args.gae_gamma,
            lam=self.args.gae_lambda,
            whiten=self.args.whiten_advantages,
            # whiten over the whole batch, every process's rows (veRL), not per process
            reduce=self._sum_over_processes,
        )
        device = self.accelerator.device
        batch["advantages"] = targets.advantages.to(device)  # (B, T): TRL's loss takes token-level advantages
        batch[OLD_VALUES] = targets.values
        batch[RETURNS] = targets.returns.to(device)
        batch[VALUE_MASK] = targets.mask
        for name, value in targets.metrics().items():
            self.log_metric(f"ppo/{name}", value, "train")
        return batch

    def _sum_over_processes(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of ``t`` over all processes (a copy with one); a collective every process calls."""
        acc = self.accelerator
        dtype = torch.float32 if acc.device.type == "mps" else torch.float64  # MPS has no float64
        return acc.reduce(t.to(acc.device, dtype), reduction="sum").cpu().double()

    # ------------------------------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if RETURNS not in inputs:  # evaluation batches have no PPO targets
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        P, C = inputs["prompt_ids"].size(1), inputs["completion_ids"].size(1)
        if self._critic is not None:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            # the critic is called directly, outside the prepared model's autocast forward (transformers leaves
            # autocast to accelerate's wrapper of that forward): bf16 compute here too, as for the rollout values
            with self.accelerator.autocast():
                values = self._critic_values(ids, attn, P, C, ids.size(0))
        else:
            with self._capturing_values() as buf:
                loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            values = self.completion_positions(buf, P, C).float()
        mask = loss_mask(inputs)  # padding rows added by the SNR filter have none
        if inputs.get(VALUE_MASK) is not None:  # unscorable rows have no value target
            mask = mask * inputs[VALUE_MASK]
        vf_loss = clipped_value_loss(
            values,
            inputs[OLD_VALUES],
            inputs[RETURNS],
            mask,
            clip=self.args.value_clip or None,
            agg=self.args.loss_agg_mode or "token-mean",
            norm_length=self.args.max_completion_length,
        )
        mode = "train" if self.model.training else "eval"
        ga = self.current_gradient_accumulation_steps if mode == "train" else 1
        with torch.no_grad():
            m = mask.bool()
            if self.args.value_clip and m.any():
                clipped = ((values - inputs[OLD_VALUES]).abs() > self.args.value_clip)[m].float().mean()
                self.log_metric("ppo/value_clipfrac", clipped.item(), mode)
        self.log_metric("ppo/value_loss", vf_loss.item(), mode)
        return loss + self.args.vf_coef * vf_loss.to(loss.dtype) / ga

    # ------------------------------------------------------------------------------------------ optimizer
    def create_optimizer(self, model=None):
        """TRL/Trainer's optimizer, with the critic (value head, or the separate critic model) moved into its own
        group at ``value_lr`` with ``critic_weight_decay``."""
        optimizer = super().create_optimizer(model)
        head = self._critic_parameters()
        ids = {id(p) for p in head}
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) not in ids]
        optimizer.add_param_group(
            {"params": head, "lr": self.args.value_lr, "weight_decay": self.args.critic_weight_decay}
        )
        return optimizer

    @compat.overrides
    def _clip_grad_norm(self, model):
        """Gradient clipping per model, as veRL clips its actor and critic each in its own optimizer step.

        ``critic_model="separate"``: the actor's and the critic's gradients are clipped each to ``max_grad_norm``;
        returns the actor's pre-clip norm (Trainer logs it as ``grad_norm``) and logs the critic's as
        ``ppo/critic_grad_norm``. ``critic_model="head"``: the value head shares the backbone with the policy,
        whose gradient is the sum of both losses', so the clipping is joint (Trainer's) and ``grad_norm`` covers
        the head too. FSDP / DeepSpeed / XLA clip all parameters together inside their engines (Trainer's).
        """
        from accelerate.utils import DistributedType

        acc = self.accelerator
        if self._critic is None or acc.distributed_type in (
            DistributedType.FSDP,
            DistributedType.DEEPSPEED,
            DistributedType.XLA,
        ):
            return super()._clip_grad_norm(model)
        acc.unscale_gradients()  # once: fp16 AMP's scaler refuses a second unscale in the same step
        critic = list(self._critic.parameters())
        ids = {id(p) for p in critic}
        actor = [p for p in model.parameters() if id(p) not in ids]
        # under DDP the gradients are already averaged over processes: local norms are the global ones
        max_norm = self.args.max_grad_norm
        critic_norm = torch.nn.utils.clip_grad_norm_(critic, max_norm)
        self.log_metric("ppo/critic_grad_norm", float(critic_norm), "train")
        return torch.nn.utils.clip_grad_norm_(actor, max_norm)

    # ------------------------------------------------------------------------------------------ checkpoints
    @compat.overrides
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        if self._critic is not None:
            self._save_beside(output_dir, state_dict, "critic.", self._critic, CRITIC_FILE, dtype=None)
        else:
            self._save_beside(
                output_dir, state_dict, "v_head.", self._v_head, VALUE_HEAD_FILE, dtype=torch.float32
            )

    def _save_beside(
        self,
        output_dir: str | None,
        state_dict: dict | None,
        prefix: str,
        module: nn.Module,
        filename: str,
        dtype: torch.dtype | None,
    ) -> None:
        """Save the policy without ``module`` (the value head or the separate critic), then ``module`` to its own
        safetensors file. Under FSDP / DeepSpeed ``state_dict`` is the gathered full state: take the module's
        tensors from it; otherwise read them from the module."""
        extra: dict = {}
        if state_dict is not None:
            extra = {k.rsplit(prefix, 1)[1]: v for k, v in state_dict.items() if prefix in k}
            state_dict = {k: v for k, v in state_dict.items() if prefix not in k}
        super()._save(output_dir, state_dict=state_dict)
        if not self.args.should_save:
            return
        from safetensors.torch import save_file

        output_dir = output_dir if output_dir is not None else str(self.args.output_dir)
        if not extra:
            extra = module.state_dict()
        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in extra.items()}
        save_file(tensors, os.path.join(output_dir, filename), metadata={"format": "pt"})

    @compat.overrides
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model=model)
        if self._critic is not None:
            load_critic(self._critic, resume_from_checkpoint)
        else:
            load_value_head(self._v_head, resume_from_checkpoint)

    @compat.overrides
    def _issue_warnings_after_load(self, load_result: Any) -> None:
        # The value head is not in the policy weights by design; it comes from value_head.safetensors.
        if hasattr(load_result, "_replace"):
            missing = [k for k in load_result.missing_keys if "v_head." not in k and "critic." not in k]
            load_result = load_result._replace(missing_keys=missing)
        super()._issue_warnings_after_load(load_result)


def load_value_head(head: nn.Linear, folder: str) -> bool:
    """Load ``value_head.safetensors`` from ``folder`` into ``head``; False (with a warning) if absent."""
    path = os.path.join(folder, VALUE_HEAD_FILE)
    if not os.path.isfile(path):
        logger.warning("%s has no %s: the value head starts from its initialisation", folder, VALUE_HEAD_FILE)
        return False
    from safetensors.torch import load_file

    tensors = load_file(path)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if name not in tensors or tensors[name].shape != param.shape:
                raise ValueError(
                    f"{path} does not match the value head ({name}: expected {tuple(param.shape)})"
                )
            param.copy_(tensors[name].to(param.device, param.dtype))
    return True


def load_critic(critic: ValueModel, folder: str) -> bool:
    """Load ``critic.safetensors`` from ``folder`` into the separate critic; False (with a warning) if absent."""
    path = os.path.join(folder, CRITIC_FILE)
    if not os.path.isfile(path):
        logger.warning("%s has no %s: the critic starts from its initialisation", folder, CRITIC_FILE)
        return False
    from safetensors.torch import load_file

    result = critic.load_state_dict(load_file(path), strict=True)
    del result
    return True


__all__ = [
    "CRITIC_FILE",
    "VALUE_HEAD_FILE",
    "LLMGymPPOTrainer",
    "ValueModel",
    "attach_critic",
    "attach_value_head",
    "load_critic",
    "load_value_head",
]
