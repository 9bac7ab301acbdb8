"""The trainer's settings for a run: optimizer and schedule from the config, the loss from the method."""

from __future__ import annotations

from typing import Any, Optional

from megatron_glue.lora import LoRASpec
from megatron_glue.trainer import TrainerSettings
from slime_ext.algo import LossSpec


def trainer_settings(cfg: Any, loss: LossSpec, total_steps: Optional[int] = None,
                     lr: Optional[float] = None) -> TrainerSettings:
    """Without `total_steps` (the RL run) the schedule counts optimizer steps: `train.steps` and
    `train.lr_warmup_steps` are rollout steps, each `cfg.minibatches_per_step()` optimizer steps. `train.lora`
    applies to the RL run only: the SFT warm start (`total_steps` given) trains every weight."""
    t, g = cfg.train, cfg.grpo
    m = g.mismatch
    per_step = cfg.minibatches_per_step() if total_steps is None else 1
    return TrainerSettings(
        lr=lr if lr is not None else t.lr, min_lr=t.min_lr, lr_warmup_steps=t.lr_warmup_steps * per_step,
        lr_decay_style=t.lr_decay_style, total_steps=max(1, total_steps or t.steps * per_step),
        weight_decay=t.weight_decay, adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2, adam_eps=t.adam_eps,
        clip_grad=t.clip_grad, micro_batch_size=t.micro_batch_size,
        max_tokens_per_micro_batch=t.parallel.max_tokens_per_gpu,
        use_distributed_optimizer=t.parallel.use_distributed_optimizer, precision=t.precision,
        optimizer_cpu_offload=t.parallel.optimizer_cpu_offload,
        recompute=t.parallel.recompute, seed=cfg.run.seed, routing_replay=t.routing_replay,
        logprob_chunk_mb=t.logprob_chunk_mb,
        lora=LoRASpec(t.lora.rank, t.lora.alpha, t.lora.dropout, tuple(t.lora.target_modules), t.lora.sync)
        if total_steps is None else LoRASpec(),
        global_batch_size=t.global_batch_size, old_logprobs=g.resolved_old_logprobs(
            cfg.minibatches_per_step(), off_policy=cfg.rollout.asynchronous),
        mismatch_mode=m.mode, mismatch_level=m.level, mismatch_cap=m.cap, mismatch_low=m.low, mismatch_high=m.high,
    ).with_loss(loss)
