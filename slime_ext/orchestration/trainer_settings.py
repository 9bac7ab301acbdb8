"""The trainer's settings for a run: optimizer and schedule from the config, the loss from the method."""

from __future__ import annotations

from typing import Any, Optional

from megatron_glue.trainer import TrainerSettings
from slime_ext.algo import LossSpec


def trainer_settings(cfg: Any, loss: LossSpec, total_steps: Optional[int] = None,
                     lr: Optional[float] = None) -> TrainerSettings:
    t = cfg.train
    return TrainerSettings(
        lr=lr if lr is not None else t.lr, min_lr=t.min_lr, lr_warmup_steps=t.lr_warmup_steps,
        lr_decay_style=t.lr_decay_style, total_steps=max(1, total_steps or t.steps),
        weight_decay=t.weight_decay, adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2, adam_eps=t.adam_eps,
        clip_grad=t.clip_grad, micro_batch_size=t.micro_batch_size,
        use_distributed_optimizer=t.parallel.use_distributed_optimizer, precision=t.precision,
        optimizer_cpu_offload=t.parallel.optimizer_cpu_offload,
        recompute=t.parallel.recompute, seed=cfg.run.seed, routing_replay=t.routing_replay,
    ).with_loss(loss)
