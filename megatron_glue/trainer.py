"""The train actor: one Megatron-core rank that turns rollout batches into optimizer steps.

Every rank of the trainer runs one `MegatronTrainer` (a Ray actor on a cluster, a plain object or a
spawned process on CPU). Each receives the whole batch of samples, keeps its data-parallel share, and
runs Megatron's forward-backward schedule (pipeline-aware) over micro-batches.

Loss normalisation is exact across micro-batches and data-parallel ranks: the per-token coefficients
and the global denominator of `slime_ext.algo.loss_coefficients` are computed from the whole batch
before the forward pass, so a token-mean (or sample-mean) over the batch is the same number whatever
the TP / PP / EP / DP layout and micro-batch size.
"""

from __future__ import annotations

import contextlib

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Iterator, Literal, Optional, Sequence

import torch
from megatron.core import parallel_state as mpu
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.moe import moe_utils

from megatron_glue import cpu_compat, routing_replay
from megatron_glue.logprobs import DEFAULT_CHUNK_MB, DeferredLMHead
from megatron_glue.lora import LoRASpec, apply_lora, canonical_state, raw_names
from megatron_glue.model_provider import ParallelSizes, build_gpt_model, transformer_config_from_hf
from megatron_glue.parallel import collective_device
from slime_ext.algo import LossSpec, grpo_per_token_loss, loss_coefficients
from slime_ext.algo.mismatch import MismatchSpec, importance_weights, mismatch_means, mismatch_sums
from slime_ext.data import RolloutBatch, Sample, build_batch

LossKind = Literal["grpo", "sft"]
PER_TOKEN_INPUTS = ("tokens", "position_ids", "loss_mask", "old_logprobs")


@dataclass
class TrainerSettings:
    """What the trainer needs: optimizer and schedule (from the run config, built by
    `slime_ext.orchestration.trainer_settings`) and the loss (a method's `LossSpec`, held whole)."""

    lr: float = 3e-5
    min_lr: float = 0.0
    lr_warmup_steps: int = 0
    lr_decay_style: str = "constant"
    total_steps: int = 1
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    micro_batch_size: int = 16
    max_tokens_per_micro_batch: Optional[int] = None  # padded tokens (rows x longest row); None: no bound
    use_distributed_optimizer: bool = True
    optimizer_cpu_offload: bool = False  # GPU runs only (see optimizer_config)
    precision: str = "fp32"
    recompute: str = "none"
    seed: int = 0
    routing_replay: bool = False  # R3: replay the engine's routed experts (samples' routed_experts) in MoE layers
    logprob_chunk_mb: float = DEFAULT_CHUNK_MB  # fp32 logits per chunk of the LM head's log-probs (logprobs.py)
    lora: LoRASpec = field(default_factory=LoRASpec)  # rank 0: every weight trains; else adapters only (lora.py)
    # the policy loss at setup: the method's specification (clip, KL, entropy, aggregation), held as it is
    # given; it decides whether a KL reference is kept. An RL batch brings its own (`train_step(loss=...)`).
    loss: LossSpec = field(default_factory=LossSpec)
    # Mini-batch PPO: samples per optimizer step (None: the whole rollout batch, one step)
    global_batch_size: Optional[int] = None
    # Old-policy logprobs of the PPO ratio: the engine's, or the trainer's recomputed before the first update
    old_logprobs: str = "engine"
    # Train-inference mismatch correction (slime_ext.algo.mismatch; needs old_logprobs "trainer")
    mismatch_mode: str = "none"
    mismatch_level: str = "token"
    mismatch_cap: float = 2.0
    mismatch_low: float = 0.5
    mismatch_high: float = 2.0

    @property
    def mismatch(self) -> MismatchSpec:
        return MismatchSpec(self.mismatch_mode, self.mismatch_level, self.mismatch_cap, self.mismatch_low,
                            self.mismatch_high)

    def with_loss(self, loss: LossSpec) -> "TrainerSettings":
        """These settings with a method's loss specification."""
        return replace(self, loss=loss)


def optimizer_config(settings: "TrainerSettings", dtype: torch.dtype, cuda: bool) -> OptimizerConfig:
    """Megatron's optimizer config. CPU offload (slime's 30B recipe: states and the Adam update on the
    host, copies overlapped with compute) applies on GPUs only; without CUDA everything is on the CPU."""
    offload = bool(settings.optimizer_cpu_offload and cuda)
    return OptimizerConfig(
        optimizer="adam",
        lr=settings.lr,
        min_lr=settings.min_lr,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_eps=settings.adam_eps,
        clip_grad=settings.clip_grad,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        use_distributed_optimizer=settings.use_distributed_optimizer,
        optimizer_cpu_offload=offload,
        optimizer_offload_fraction=1.0 if offload else 0.0,
        overlap_cpu_optimizer_d2h_h2d=offload,
    )


def _shift_left(x: torch.Tensor) -> torch.Tensor:
    """Token-aligned -> logit-aligned: position t of the result describes token t+1."""
    return torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)


def _shift_right(x: torch.Tensor) -> torch.Tensor:
    """Logit-aligned -> token-aligned (position 0, the first prompt token, gets 0)."""
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)


class MegatronTrainer:
    """One trainer rank. Parallel state must be initialised (`megatron_glue.parallel`)."""

    def __init__(self, hf_config: Any, settings: TrainerSettings, sizes: ParallelSizes, pad_id: int = 0):
        cpu_compat.apply()
        self.hf_config = hf_config
        self.settings = settings
        self.sizes = sizes
        self.pad_id = pad_id
        dtype = torch.bfloat16 if settings.precision == "bf16" else torch.float32
        self.tconfig = transformer_config_from_hf(hf_config, sizes, params_dtype=dtype, recompute=settings.recompute,
                                                  routing_replay=settings.routing_replay)
        model = build_gpt_model(
            hf_config,
            self.tconfig,
            pre_process=mpu.is_pipeline_first_stage(),
            post_process=mpu.is_pipeline_last_stage(),
            # LoRA wraps megatron-core's own linear layers: Transformer Engine's spec fuses the norm into q/k/v and
            # fc1, so an adapter there would see the un-normalised input. LoRA runs the local spec on GPUs too.
            use_te=False if settings.lora.rank else None,
        )
        # LoRA: the adapters are the only trainable parameters, so DDP and the optimizer hold nothing for the rest
        self.adapters = apply_lora(model, settings.lora, seed=settings.seed)
        if torch.cuda.is_available():
            model.cuda(torch.cuda.current_device())
        # log-probs are taken from the head's input a chunk of tokens at a time (no [tokens, vocab] logits)
        self.head = DeferredLMHead(model) if mpu.is_pipeline_last_stage() else None
        # Megatron's aux-loss tracker is a process global sized by the first model's layer count: a second
        # trainer with more layers in the same process would index past it
        moe_utils.get_moe_layer_wise_logging_tracker().clear()
        if self.head is not None:
            self.head.chunk_mb = settings.logprob_chunk_mb
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=settings.use_distributed_optimizer,
        )
        self.model = DistributedDataParallel(self.tconfig, ddp_config, model)
        cpu_compat.cuda_typed(self.model.parameters())
        self.optimizer = get_megatron_optimizer(optimizer_config(settings, dtype, torch.cuda.is_available()), [self.model])
        self.scheduler = OptimizerParamScheduler(
            self.optimizer,
            init_lr=0.0 if settings.lr_warmup_steps else settings.lr,
            max_lr=settings.lr,
            min_lr=settings.min_lr,
            # megatron-core requires warmup < decay steps; a run shorter than its warmup warms up throughout
            lr_warmup_steps=min(settings.lr_warmup_steps, max(settings.total_steps - 1, 0)),
            lr_decay_steps=settings.total_steps,
            lr_decay_style=settings.lr_decay_style,
            start_wd=settings.weight_decay,
            end_wd=settings.weight_decay,
            wd_incr_steps=settings.total_steps,
            wd_incr_style="constant",
        )
        self.tconfig.finalize_model_grads_func = finalize_model_grads
        self.tconfig.no_sync_func = self.model.no_sync
        self.step = 0
        self._reference: Optional[dict[str, torch.Tensor]] = None

    # -- parallel coordinates ---------------------------------------------------------------------
    @property
    def dp_rank(self) -> int:
        return mpu.get_data_parallel_rank()

    @property
    def dp_size(self) -> int:
        return mpu.get_data_parallel_world_size()

    @property
    def is_output_rank(self) -> bool:
        """The rank whose results the driver reads: last pipeline stage, TP rank 0, DP rank 0."""
        return mpu.is_pipeline_last_stage() and mpu.get_tensor_model_parallel_rank() == 0 and self.dp_rank == 0

    def local_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's Megatron parameter shard (local layer / expert numbering), as a model without adapters
        holds it: with LoRA each adapted weight is merged (what the HF export and the engines take)."""
        return canonical_state(self.raw_state_dict(), self.adapters)

    def load_local_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy a shard of `local_state_dict`'s names into the parameters (in place: DDP keeps params as views of
        its buffers); with LoRA the weights load into the frozen base and the adapters keep what they hold."""
        self.load_raw_state_dict(raw_names(state, self.adapters), adapters_optional=True)

    def raw_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter under its own name (with LoRA: the frozen base and the adapters apart), for the
        checkpoint and the KL reference, which must restore the same parametrisation."""
        return {k: v for k, v in self.model.module.state_dict().items() if not k.endswith("_extra_state")}

    def load_raw_state_dict(self, state: dict[str, torch.Tensor], adapters_optional: bool = False) -> None:
        missing, unexpected = self.model.module.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")
                   and not (adapters_optional and k.rpartition(".")[2] in ("lora_a", "lora_b"))]
        if missing or unexpected:
            raise KeyError(f"state dict does not fit this rank's model: missing {missing}, unexpected {unexpected}")
        self.optimizer.reload_model_params()

    # -- reference model (KL) ---------------------------------------------------------------------
    def snapshot_reference(self) -> None:
        """Freeze the current weights as the KL reference (kept on CPU, swapped in for ref logprobs)."""
        self._reference = {k: v.detach().to("cpu", copy=True) for k, v in self.raw_state_dict().items()}

    @property
    def has_reference(self) -> bool:
        return self._reference is not None

    # -- batches ----------------------------------------------------------------------------------
    def _my_samples(self, samples: Sequence[Sample]) -> list[Sample]:
        if len(samples) < self.dp_size:
            raise ValueError(f"batch of {len(samples)} samples is smaller than the data-parallel size {self.dp_size}")
        return list(samples[self.dp_rank :: self.dp_size])

    def _micro_batches(self, samples: list[Sample], extra: Optional[dict[str, dict[str, torch.Tensor]]] = None) -> list[dict]:
        """Padded micro-batches, every per-token tensor shifted to logit alignment.

        Samples are grouped by length (sorted, stable) before cutting: each micro-batch pads to its longest
        row, so mixing a 30-token response with a 160-token one would compute the padding. Every consumer
        is order-free (per-sample outputs are keyed by sample id, losses are sums over one global
        denominator), so only the padding changes."""
        pad_multiple = self.sizes.tp if self.sizes.sequence_parallel else 1
        out = []
        for chunk in self._cut_micro_batches(sorted(samples, key=lambda s: s.total_len)):
            batch = build_batch(chunk, pad_id=self.pad_id, pad_to_multiple_of=pad_multiple)
            mb = {
                "batch": batch,
                "tokens": batch.tokens,
                "position_ids": batch.position_ids,
                "targets": _shift_left(batch.tokens),
                "loss_mask": _shift_left(batch.loss_mask),
                "old_logprobs": _shift_left(batch.old_logprobs),
                "advantages": _shift_left(batch.token_advantage()),
                "weights": _shift_left(batch.per_token(batch.weights)),
            }
            for name, per_sample in (extra or {}).items():
                rows = [per_sample[s.sample_id] for s in chunk]
                mb[name] = _shift_left(_pad_rows(rows, batch))
            if self.settings.routing_replay and any(s.routed_experts is not None for s in chunk):
                # token-aligned (not shifted): row t is the routing of the forward at token t
                mb["routed_experts"] = routing_replay.batch_grid([s.routed_experts for s in chunk],
                                                                 tuple(batch.tokens.shape))
            out.append(mb)
        return out

    def _cut_micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """Consecutive runs of the length-sorted samples: at most `micro_batch_size` rows and, when set, at most
        `max_tokens_per_micro_batch` padded tokens (the bound the memory plan sizes activations by; a single
        longer sample is a micro-batch of its own)."""
        mbs, cap = self.settings.micro_batch_size, self.settings.max_tokens_per_micro_batch
        chunks: list[list[Sample]] = []
        for sample in samples:  # ascending length: the newest sample is the row a batch pads to
            last = chunks[-1] if chunks else None
            if last is not None and len(last) < mbs and (cap is None or (len(last) + 1) * sample.total_len <= cap):
                last.append(sample)
            else:
                chunks.append([sample])
        return chunks

    def _to_device(self, mb: dict) -> dict:
        if not torch.cuda.is_available():
            return mb
        return {k: (v.cuda(non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in mb.items()}

    def _run(self, micro_batches: list[dict], loss_func: Any, forward_only: bool) -> list[dict]:
        fb = get_forward_backward_func()

        def forward_step(data_iterator: Iterator[dict], model: Any) -> tuple[torch.Tensor, Any]:
            mb = self._to_device(next(data_iterator))
            if self.settings.routing_replay:  # every micro-batch sets targets (-1 grid without routing)
                routing_replay.set_targets(self.model, mb.get("routed_experts"), tuple(mb["tokens"].shape),
                                           self.tconfig.moe_router_topk, self.sizes.sequence_parallel)
            output = model(mb["tokens"], mb["position_ids"], attention_mask=None)
            return output, partial(loss_func, mb)

        seq_len = max(mb["tokens"].shape[1] for mb in micro_batches)
        try:
            with self.head.deferred() if self.head is not None else contextlib.nullcontext():
                return fb(
                    forward_step_func=forward_step,
                    data_iterator=iter(micro_batches),
                    model=[self.model],
                    num_microbatches=len(micro_batches),
                    seq_length=seq_len,
                    micro_batch_size=max(mb["tokens"].shape[0] for mb in micro_batches),
                    forward_only=forward_only,
                )
        finally:
            if self.settings.routing_replay:
                routing_replay.clear(self.model)

    # -- forward only -----------------------------------------------------------------------------
    @torch.no_grad()
    def compute_logprobs(
        self, samples: Sequence[Sample], reference: bool = False, with_entropy: bool = False
    ) -> Optional[dict[str, dict[str, torch.Tensor]]]:
        """Response-token logprobs (and entropy) per sample id, gathered on the output rank.

        Returns {"logprobs": {sample_id: [response_len]}, "entropy": ...} on the output rank, None elsewhere.
        With `reference=True` the frozen reference weights are swapped in for the pass.
        """
        if reference and self._reference is None:
            raise RuntimeError("reference logprobs requested but no reference snapshot was taken")
        saved = None
        if reference:
            saved = {k: v.detach().clone() for k, v in self.raw_state_dict().items()}
            self.load_raw_state_dict(self._reference)
        self.model.eval()
        try:
            mine = self._my_samples(samples)
            outputs = self._run(self._micro_batches(mine), partial(self._logprob_loss, with_entropy), forward_only=True)
        finally:
            self.model.train()
            if saved is not None:
                self.load_raw_state_dict(saved)
        result: dict[str, dict[str, torch.Tensor]] = {"logprobs": {}}
        if with_entropy:
            result["entropy"] = {}
        if mpu.is_pipeline_last_stage():
            for out in outputs:
                for key in result:
                    result[key].update(out[key])
        return self._gather_over_dp(result)

    def _logprob_loss(self, with_entropy: bool, mb: dict, hidden: torch.Tensor) -> tuple[torch.Tensor, dict]:
        lp, ent = self.head.logprobs(hidden, mb["targets"], with_entropy)
        batch: RolloutBatch = mb["batch"]
        out = {"logprobs": _per_sample_response(_shift_right(lp).cpu(), batch)}
        if with_entropy:
            out["entropy"] = _per_sample_response(_shift_right(ent).cpu(), batch)
        return torch.zeros((), device=hidden.device), out

    def _gather_over_dp(self, result: dict) -> Optional[dict]:
        if self.dp_size == 1:
            return result if mpu.is_pipeline_last_stage() and mpu.get_tensor_model_parallel_rank() == 0 else None
        gathered: list[Any] = [None] * self.dp_size
        torch.distributed.all_gather_object(gathered, result, group=mpu.get_data_parallel_group())
        if not self.is_output_rank:
            return None
        merged = {key: {} for key in result}
        for part in gathered:
            for key, values in part.items():
                merged[key].update(values)
        return merged

    # -- training ---------------------------------------------------------------------------------
    def train_step(
        self,
        samples: Sequence[Sample],
        kind: LossKind = "grpo",
        ref_logprobs: Optional[dict[str, torch.Tensor]] = None,
        loss: Optional[LossSpec] = None,
    ) -> dict[str, float]:
        """One rollout batch: one optimizer step, or one per mini-batch with `global_batch_size` (mini-batch
        PPO). GRPO needs `advantage` and the engine's logprobs on every sample; with `old_logprobs: trainer`
        the old policy's logprobs are recomputed for the whole batch before the first update. `loss` is the
        policy loss of this batch (the method's spec when the batch was made; it travels with the batch, so
        a method whose spec changes during the run is followed step by step); None: `settings.loss`.
        Returns global metrics: means over the batch's trained tokens (`_max` keys: maxima), `grad_norm` the
        mean over the optimizer steps, `optimizer_steps` their number, and the train-inference mismatch
        (`mismatch/*`)."""
        s = self.settings
        loss = loss if loss is not None else s.loss
        if kind == "grpo":
            self._check_grpo_inputs(samples, ref_logprobs, loss)
        chunks = self.minibatches(samples) if kind == "grpo" else [list(samples)]
        old: Optional[dict[str, torch.Tensor]] = None
        raw: dict[str, float] = {}
        if kind == "grpo" and s.old_logprobs == "trainer":
            old, raw = self._recompute_old_logprobs(chunks)
        steps, ratios = [], []
        for i, chunk in enumerate(chunks):
            # Without a recompute, the first mini-batch's forward runs on the old weights: it measures the mismatch.
            measure = kind == "grpo" and old is None and i == 0
            metrics, step_raw, step_ratios = self._optimizer_step(chunk, kind, loss, ref_logprobs, old, measure)
            steps.append(metrics)
            raw.update(step_raw)
            ratios.extend(step_ratios)
        self.step += 1
        moe_utils.clear_aux_losses_tracker()  # per-layer aux losses: summed per step, never read by us
        out = _combine_steps(steps)
        out.update(_mismatch_metrics(raw))
        if kind == "grpo":
            out.update(self._ratio_quantiles(ratios))
        return out

    def minibatches(self, samples: Sequence[Sample]) -> list[list[Sample]]:
        """The rollout batch cut into round(trained samples / global_batch_size) mini-batches of near-equal
        size, in order. Samples with no trained token (dropped groups, failed rollouts) add nothing to a loss
        or its denominator, so they are left out when the batch is cut (they would only pad mini-batches)."""
        gbs = self.settings.global_batch_size
        if gbs is None or gbs >= len(samples):
            return [list(samples)]
        trained = [x for x in samples if any(m > 0 for m in x.loss_mask)]
        count = max(1, min(round(len(trained) / gbs), len(trained) // self.dp_size))
        if count == 1:
            return [list(samples)]
        bounds = [round(i * len(trained) / count) for i in range(count + 1)]
        return [trained[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def _check_grpo_inputs(self, samples: Sequence[Sample], ref_logprobs: Optional[dict], loss: LossSpec) -> None:
        missing = [x.sample_id for x in samples if x.advantage is None]
        if missing:
            raise ValueError(f"GRPO step needs an advantage on every sample; missing on {missing[:5]}")
        lacking_lp = [x.sample_id for x in samples if x.logprobs is None]
        if lacking_lp:
            raise ValueError(f"GRPO step needs the engine's logprobs on every sample; missing on {lacking_lp[:5]}")
        if loss.kl_coef > 0 and ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs reference logprobs (compute_logprobs(reference=True))")

    @torch.no_grad()
    def _recompute_old_logprobs(self, chunks: list[list[Sample]]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """This rank's old-policy logprobs (on the last pipeline stage; empty elsewhere) for every mini-batch,
        with the weights before any update, and the global mismatch sums against the engine's logprobs.
        The model stays in train mode so that the first mini-batch's ratio is exactly 1."""
        old: dict[str, torch.Tensor] = {}
        outputs: list[dict] = []
        for chunk in chunks:
            micro_batches = self._micro_batches(self._my_samples(chunk))
            outputs.extend(self._run(micro_batches, self._old_logprob_loss, forward_only=True))
        for out in outputs:
            old.update(out.pop("logprobs"))
        return old, self._global_sums(outputs)

    def _old_logprob_loss(self, mb: dict, hidden: torch.Tensor) -> tuple[torch.Tensor, dict]:
        lp, _ = self.head.logprobs(hidden, mb["targets"])
        out: dict[str, Any] = {"logprobs": _per_sample_response(_shift_right(lp).cpu(), mb["batch"])}
        out.update(_raw_mismatch(lp, mb["old_logprobs"].to(lp.device), mb["loss_mask"].to(lp.device)))
        return torch.zeros((), device=hidden.device), out

    def _optimizer_step(self, samples: list[Sample], kind: LossKind, spec: LossSpec,
                        ref_logprobs: Optional[dict[str, torch.Tensor]], old: Optional[dict[str, torch.Tensor]],
                        measure: bool) -> tuple[dict, dict, list]:
        """Forward-backward over one mini-batch and one optimizer step; the loss is normalised by this
        mini-batch's own global denominator. Returns (metrics, raw mismatch sums, per-token ratios)."""
        # Global denominator from the whole mini-batch (every rank sees all of it); only the response masks
        # matter, so no full token batch is built for it.
        masks = torch.nn.utils.rnn.pad_sequence(
            [torch.tensor(x.loss_mask, dtype=torch.float32) for x in samples], batch_first=True)
        _, denominator = loss_coefficients(masks, spec.loss_agg if kind == "grpo" else "token_mean")
        denominator = float(denominator)
        mine = self._my_samples(samples)
        extra = {}
        if ref_logprobs is not None:
            extra["ref_logprobs"] = {x.sample_id: ref_logprobs[x.sample_id] for x in mine}
        if old is not None and mpu.is_pipeline_last_stage():
            extra["trainer_old_logprobs"] = {x.sample_id: old[x.sample_id] for x in mine}
        micro_batches = self._micro_batches(mine, extra)
        scale = len(micro_batches) * self.dp_size / max(denominator, 1e-8)

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        loss_func = partial(self._train_loss, kind, spec, scale, measure)
        outputs = self._run(micro_batches, loss_func, forward_only=False)
        success, grad_norm, _ = self.optimizer.step()
        if success:
            self.scheduler.step(increment=1)
        ratios = [out.pop("ratios") for out in outputs if "ratios" in out]
        sums = self._global_sums(outputs)
        raw = {k: sums.pop(k) for k in list(sums) if k.startswith(RAW_PREFIX)}
        metrics = {name: (value if name.endswith("_max") else value / max(denominator, 1e-8))
                   for name, value in sums.items() if name != "tokens"}
        metrics.update(tokens=sums.get("tokens", 0.0), denominator=denominator,
                       grad_norm=float(grad_norm) if grad_norm is not None else math.nan,
                       lr=self.optimizer.param_groups[0]["lr"], step_skipped=float(not success))
        return metrics, raw, ratios

    def _train_loss(self, kind: LossKind, spec: LossSpec, scale: float, measure: bool, mb: dict,
                    hidden: torch.Tensor) -> tuple[torch.Tensor, dict]:
        s = self.settings
        lp, ent = self.head.logprobs(hidden, mb["targets"], with_entropy=kind == "grpo")
        seq_mask = mb["loss_mask"].to(lp.device)
        coef, _ = loss_coefficients(seq_mask, spec.loss_agg if kind == "grpo" else "token_mean")
        extra: dict[str, Any] = {}
        if kind == "sft":
            per_token = -lp
            parts = {"nll": per_token.detach()}
        else:
            engine_lp = mb["old_logprobs"].to(lp.device)
            old_lp = mb["trainer_old_logprobs"].to(lp.device) if "trainer_old_logprobs" in mb else engine_lp
            correction = importance_weights(old_lp, engine_lp, seq_mask, s.mismatch) if s.mismatch_mode != "none" else None
            per_token, parts = grpo_per_token_loss(
                lp, old_lp, mb["advantages"].to(lp.device),
                weights=mb["weights"].to(lp.device),
                ref_logprobs=mb["ref_logprobs"].to(lp.device) if "ref_logprobs" in mb else None,
                entropy=ent if spec.entropy_coef > 0 else (ent.detach() if ent is not None else None),
                eps_low=spec.eps_clip_low, eps_high=spec.eps_clip_high, kl_coef=spec.kl_coef,
                kl_estimator=spec.kl_estimator, entropy_coef=spec.entropy_coef,
                mismatch_weights=correction.weights if correction is not None else None,
            )
            if correction is not None:
                parts["mismatch/truncated_frac"] = correction.truncated
                parts["mismatch/masked_frac"] = correction.masked
                parts["mismatch/weight_mean"] = correction.weights
            trained = seq_mask > 0
            extra["ratios"] = torch.exp(lp.detach() - old_lp)[trained].float().cpu()
            if measure:
                extra.update(_raw_mismatch(lp.detach(), engine_lp, seq_mask))
        loss = (per_token * coef).sum() * scale
        reduced: dict[str, Any] = {name: float((value * coef).sum()) for name, value in parts.items()}
        reduced["tokens"] = float((seq_mask > 0).sum())
        reduced.update(extra)
        return loss, reduced

    def _global_sums(self, outputs: list[dict]) -> dict[str, float]:
        """Every float a micro-batch reported, summed over micro-batches and DP ranks (names ending in
        `_max`: the maximum); every rank returns the same numbers."""
        names = sorted({k for out in outputs for k, v in out.items() if isinstance(v, float)}) if outputs else []
        # Ranks that hold no loss (earlier pipeline stages) learn the names from the last stage.
        holder = [names]
        pp = mpu.get_pipeline_model_parallel_world_size() > 1
        if pp:
            torch.distributed.broadcast_object_list(
                holder, src=mpu.get_pipeline_model_parallel_last_rank(), group=mpu.get_pipeline_model_parallel_group()
            )
        names = holder[0]
        sums = [0.0] * len(names)
        maxima = [0.0] * len(names)
        if mpu.is_pipeline_last_stage():
            for out in outputs:
                for i, name in enumerate(names):
                    sums[i] += out.get(name, 0.0)
                    maxima[i] = max(maxima[i], out.get(name, 0.0))
        dp_group = mpu.get_data_parallel_group()
        device = collective_device(dp_group)
        sums_t = torch.tensor(sums, dtype=torch.float64, device=device)
        maxima_t = torch.tensor(maxima, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(sums_t, group=dp_group)
        torch.distributed.all_reduce(maxima_t, op=torch.distributed.ReduceOp.MAX, group=dp_group)
        is_max = torch.tensor([name.endswith("_max") for name in names], dtype=torch.bool, device=device)
        values = torch.where(is_max, maxima_t, sums_t)
        if pp:
            pp_group = mpu.get_pipeline_model_parallel_group()
            values = values.to(collective_device(pp_group))
            torch.distributed.broadcast(values, src=mpu.get_pipeline_model_parallel_last_rank(), group=pp_group)
        return dict(zip(names, values.tolist()))

    def _ratio_quantiles(self, ratios: list[torch.Tensor]) -> dict[str, float]:
        """Quantiles of pi / pi_old over the batch's trained tokens (gathered over DP; same on every rank)."""
        local = torch.cat(ratios) if ratios else torch.zeros(0)
        parts: list[Any] = [local]
        if self.dp_size > 1:
            parts = [None] * self.dp_size
            torch.distributed.all_gather_object(parts, local, group=mpu.get_data_parallel_group())
        values = torch.cat([p for p in parts if p is not None]).double()
        probs = torch.tensor(RATIO_QUANTILES, dtype=torch.float64)
        result = torch.quantile(values, probs) if values.numel() else torch.ones(len(probs), dtype=torch.float64)
        holder = [result]
        if mpu.get_pipeline_model_parallel_world_size() > 1:
            torch.distributed.broadcast_object_list(
                holder, src=mpu.get_pipeline_model_parallel_last_rank(), group=mpu.get_pipeline_model_parallel_group()
            )
        return {f"ratio/p{round(q * 100):02d}": float(v) for q, v in zip(RATIO_QUANTILES, holder[0])}


RAW_PREFIX = "raw/"
RATIO_QUANTILES = (0.0, 0.01, 0.5, 0.99, 1.0)
# Metrics of one optimizer step that are not token means: summed, or taken from the last step
_SUMMED = ("tokens", "step_skipped")


MISMATCH_RAW = RAW_PREFIX + "mismatch_"


def _raw_mismatch(train_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mismatch sums under raw/ names (`_global_sums` sums them, and takes the max of `..._max`)."""
    return {MISMATCH_RAW + k: v for k, v in mismatch_sums(train_lp, engine_lp, mask).items()}


def _mismatch_metrics(raw: dict[str, float]) -> dict[str, float]:
    """Token means of the global mismatch sums (none when nothing measured the mismatch)."""
    sums = {k.removeprefix(MISMATCH_RAW): v for k, v in raw.items() if k.startswith(MISMATCH_RAW)}
    return {f"mismatch/{k}": v for k, v in mismatch_means(sums).items()} if sums else {}


def _combine_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """One rollout batch's metrics from its optimizer steps: token means weighted by each mini-batch's
    denominator (so they equal the means over the whole batch), maxima, sums, the mean grad norm and the
    last learning rate."""
    if len(steps) == 1:
        out = dict(steps[0])
        out.pop("denominator")
        out["optimizer_steps"] = 1.0
        return out
    total = sum(m["denominator"] for m in steps)
    out: dict[str, float] = {}
    for name in steps[0]:
        values = [m.get(name, 0.0) for m in steps]
        if name in _SUMMED:
            out[name] = sum(values)
        elif name.endswith("_max"):
            out[name] = max(values)
        elif name == "grad_norm":
            out[name] = sum(values) / len(values)
        elif name == "lr":
            out[name] = values[-1]
        elif name != "denominator":
            out[name] = sum(v * m["denominator"] for v, m in zip(values, steps)) / max(total, 1e-8)
    out["optimizer_steps"] = float(len(steps))
    return out


def _pad_rows(rows: list[torch.Tensor], batch: RolloutBatch) -> torch.Tensor:
    """Place response-aligned per-sample values onto the padded token grid of `batch`."""
    out = torch.zeros(batch.tokens.shape, dtype=torch.float32)
    for i, values in enumerate(rows):
        start = int(batch.prompt_lens[i])
        out[i, start : start + len(values)] = values.float()
    return out


def _per_sample_response(per_token: torch.Tensor, batch: RolloutBatch) -> dict[str, torch.Tensor]:
    out = {}
    for i, sid in enumerate(batch.sample_ids):
        start = int(batch.prompt_lens[i])
        out[sid] = per_token[i, start : start + int(batch.response_lens[i])].clone()
    return out
