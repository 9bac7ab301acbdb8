"""Memory of one trainer rank and one engine GPU, term by term, and which config keys shrink each term.

Why: a 30B launch that does not fit fails after many node-minutes; the same arithmetic fails here in a second.
The activation counts are not guesses: they were measured on this code (megatron-core 0.16 local layer spec,
our grouped experts and chunked LM-head log-probs) with `megatron_glue.memory_meter` over 14 shapes (hidden
64-256, query/key-value widths, expert FFN, top-k, experts, layers, dense and MoE; least squares, every shape
within 1.5%), and `tests/orchestration/test_memory_model.py` holds the whole estimate against measured peaks.
CPU and GPU run one code path, so the element counts carry over; the element size follows the precision.

Trainer rank (the heaviest pipeline stage; `plan_shape.ParamSplit` holds the parameter counts):

* weights: 2 bytes per local parameter in bf16 (4 in fp32); gradients: 4 bytes (megatron's fp32 grad buffer,
  full size even with the distributed optimizer); optimizer: fp32 main params (bf16 only) + Adam moments
  (8 bytes), divided by DP for non-expert and by expert-DP for expert parameters with the distributed
  optimizer, on the host when `optimizer_cpu_offload` is on.
* activations of one micro-batch of T tokens, element size e (2 bf16, 4 fp32), s = TP with sequence parallel
  else 1, t = TP; per token and layer, counted in elements:
      ATTN_Q * q / t + ATTN_KV * (k + v widths) / t
      MoE:   MOE_H * h / s + top_k * (MOE_ROUTED_FFN * I + MOE_ROUTED_H * h) / s
      dense: DENSE_H * h / s + DENSE_FFN * I / t
  plus FIXED_H * h / s per token outside the layers (embedding output, final norm, the LM head's input and its
  gradient); times layers per stage and PP micro-batches in flight (1F1B). Full recompute keeps each layer's
  input (h / s elements per token) and one layer's activations.
* expert weight stacks: the grouped experts stack the local expert weights for one grouped matmul and autograd
  keeps the stack: local expert parameters x e per micro-batch in flight (not with Transformer Engine).
* LM-head log-probs: LOGPROB_CHUNK_COPIES fp32 copies of one chunk's logits, min(T, tokens per chunk) x V / t
  (`train.logprob_chunk_mb`); no [T, V] tensor.
* runtime (GPU only): RUNTIME_OVERHEAD_GIB for the CUDA context, NCCL buffers and allocator fragmentation, an
  assumption that no measurement here covers.

Engine GPU (SGLang): weights = total parameters x 2 bytes x models per engine / tp_size; the static pool is
`mem_fraction_static` x GPU memory and the KV cache gets what the weights leave; KV bytes per token = layers x 2
x max(1, kv_heads / tp_size) x head_dim x 2 bytes. Colocated engines release their memory while the trainer
runs (and the trainer offloads during rollout), so each phase is compared with the GPU on its own.

Embedded engine (CPU runs: the in-process engine or the CPU engine servers; `embedded_engine_memory`), one
generate call holding a whole rollout step (`rollout.prompts_per_step` prompts x `n_samples_per_prompt` rows,
prompts of `max_prompt_len`, responses of `max_response_len`: an upper bound), element size e of the engine's
precision, kv = layers x 2 x kv_heads x head_dim x e bytes per token, per model held (two with a partner):
weights; the batch's KV (each prompt once plus every row's own slots, which start at 64 and double); the prefix
cache (prompts once plus every row's generated tokens, within its token budget); the next-token logits (rows x
V, fp32); and the prefill's attention scores (rows x heads x prompt x prompt fp32, chunked at
PREFILL_ATTENTION_ELEMENTS, PREFILL_SCORE_COPIES of it live); the peak is the larger of prefill and decode.
Measured against `EmbeddedEngine.generate` in `tests/orchestration/test_memory_model.py`.

Not covered (named in the plan's output): the Python heap and CUDA graphs, allocator caching and
fragmentation beyond the runtime term, Megatron's per-micro-batch communication buffers, the KL reference copy
(`grpo.kl_coef > 0`: one more copy of the weights, on the host), and the engine's activations outside
SGLang's static pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from megatron_glue.logprob_chunks import tokens_per_chunk  # no torch / megatron.core import

from slime_ext.orchestration.plan_layout import RolloutLayout, TrainerLayout
from slime_ext.orchestration.plan_shape import ModelShape, ParamSplit

GIB = 1024**3
RUNTIME_OVERHEAD_GIB = 4.0

# elements per token and layer (fitted on measured peaks; see the module docstring)
ATTN_Q = 5.25
ATTN_KV = 1.2
MOE_H = 5.9
MOE_ROUTED_FFN = 5.21
MOE_ROUTED_H = 1.83
DENSE_H = 8.0
DENSE_FFN = 5.0
FIXED_H = 6.6
LOGPROB_CHUNK_COPIES = 3
PREFILL_SCORE_COPIES = 1.4  # measured: scores, their softmax in part, the chunk's other activations
OWN_KV_SLOTS = 64  # static_kv.CAPACITY_SLACK

NOT_COVERED = ("Python heap", "allocator caching/fragmentation (GPU: within the runtime term)",
               "communication buffers", "KL reference weights (host)", "engine activations outside the static pool")

# the keys that shrink each trainer term, for the error of a layout that does not fit
TRAINER_FIXES = {
    "weights": "train.parallel.tensor_model_parallel_size / expert_model_parallel_size / pipeline_model_parallel_size",
    "grads_fp32": "train.parallel.tensor_model_parallel_size / expert_model_parallel_size / "
                  "pipeline_model_parallel_size",
    "optimizer": "train.parallel.optimizer_cpu_offload: true, train.parallel.use_distributed_optimizer: true, or more "
                 "data-parallel ranks",
    "act_layers": "train.parallel.recompute: full, train.parallel.max_tokens_per_gpu, "
                  "train.parallel.sequence_parallel: true",
    "act_layer_checkpoints": "train.parallel.max_tokens_per_gpu, train.parallel.sequence_parallel: true, "
                             "train.parallel.pipeline_model_parallel_size",
    "act_recomputed_layer": "train.parallel.max_tokens_per_gpu",
    "act_outside_layers": "train.parallel.max_tokens_per_gpu, train.parallel.sequence_parallel: true",
    "expert_stacks": "train.parallel.expert_model_parallel_size, train.parallel.recompute: full",
    "logprob_chunks": "train.logprob_chunk_mb",
}
ENGINE_FIXES = "sglang.tp_size, sglang.mem_fraction_static"


@dataclass(frozen=True)
class TrainerMemory:
    local_params: int  # parameters on one GPU of the heaviest stage
    local_expert_params: int
    components_gib: dict[str, float]
    total_gib: float
    host_offload_gib_per_node: float
    fits: Optional[bool]  # None on CPU runs
    tokens_per_micro_batch: int = 0
    lora_params: int = 0  # LoRA adapters on this GPU: the only parameters with gradients and optimizer state


@dataclass(frozen=True)
class EngineMemory:
    weights_gib: float
    static_gib: float
    kv_cache_gib: float
    kv_bytes_per_token: int
    kv_tokens: int
    fits: Optional[bool]


def local_param_counts(split: ParamSplit, layout: TrainerLayout) -> tuple[int, int, int]:
    """(TP-split, replicated, expert) parameters on one GPU of the heaviest pipeline stage."""
    layers = split.num_layers // layout.pp
    if layout.pp == 1:
        edge = split.embedding + split.output
    else:
        edge = max(split.embedding, split.output or split.embedding)
    tp_split = math.ceil((layers * (split.attention + split.dense_mlp) + edge) / layout.tp)
    replicated = layers * split.replicated + split.final_norm  # final norm: last stage (tiny)
    experts = math.ceil(layers * split.experts / (layout.ep * layout.etp))
    return tp_split, replicated, experts


def activation_elements_per_token(shape: ModelShape, tp: int, sp: int) -> tuple[float, float]:
    """(per layer, outside the layers) activation elements per token of a micro-batch."""
    h = shape.hidden
    q, kv = shape.num_heads * shape.head_dim, 2 * shape.num_kv_heads * shape.head_dim
    layer = (ATTN_Q * q + ATTN_KV * kv) / tp
    if shape.num_experts:
        layer += MOE_H * h / sp + shape.top_k * (MOE_ROUTED_FFN * shape.moe_ffn + MOE_ROUTED_H * h) / sp
    else:
        layer += DENSE_H * h / sp + DENSE_FFN * shape.dense_ffn / tp
    return layer, FIXED_H * h / sp


def activation_bytes(shape: ModelShape, layout: TrainerLayout, tokens: int, chunk_mb: float,
                     local_expert_params: int) -> dict[str, int]:
    """Bytes of one rank's activations for micro-batches of `tokens` tokens (module docstring)."""
    elem = 2 if layout.precision == "bf16" else 4
    sp = layout.tp if layout.sequence_parallel else 1
    per_layer, outside = activation_elements_per_token(shape, layout.tp, sp)
    layers, inflight = shape.num_layers // layout.pp, layout.pp
    layer = int(tokens * per_layer * elem)
    local_vocab = math.ceil(shape.vocab / layout.tp)
    chunk_tokens = min(tokens, tokens_per_chunk(local_vocab, chunk_mb))
    out = ({"act_layer_checkpoints": int(inflight * layers * tokens * shape.hidden / sp * elem),
            "act_recomputed_layer": layer} if layout.recompute == "full" else {"act_layers": inflight * layers * layer})
    out["act_outside_layers"] = int(inflight * tokens * outside * elem)
    if local_expert_params and layout.recompute != "full":
        out["expert_stacks"] = inflight * local_expert_params * elem
    elif local_expert_params:  # recompute keeps the stack of the layer being recomputed only
        out["expert_stacks"] = local_expert_params // max(1, layers) * elem
    out["logprob_chunks"] = LOGPROB_CHUNK_COPIES * chunk_tokens * local_vocab * 4
    return out


def lora_params_per_rank(shape: ModelShape, layout: TrainerLayout, rank: int, targets: tuple[str, ...]) -> int:
    """Adapter parameters on one GPU of the heaviest stage (`train.lora`): per layer and target, A [r, in] and
    B [out, r], the TP-split side divided by TP (column layers split B, row layers A). The dense MLP's fc1 is the
    fused gate and up projection (2 x ffn wide); MoE layers have no dense MLP (their experts' adapters:
    `lora_expert_params_per_rank`)."""
    if rank < 1:
        return 0
    h, tp = shape.hidden, layout.tp
    q, kv, ffn = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim, shape.dense_ffn
    dense = shape.num_experts == 0
    per_layer = {"linear_qkv": h + (q + 2 * kv) / tp, "linear_proj": q / tp + h,
                 "linear_fc1": (h + 2 * ffn / tp) if dense else 0, "linear_fc2": (ffn / tp + h) if dense else 0}
    return math.ceil(shape.num_layers // layout.pp * rank * sum(per_layer.get(t, 0) for t in targets))


def lora_expert_params_per_rank(shape: ModelShape, layout: TrainerLayout, rank: int, targets: tuple[str, ...]) -> int:
    """Expert adapter parameters on one GPU of the heaviest stage (target `experts`, expert-TP 1): every local
    expert (E / EP of them) of every layer has fc1 (A [r, h], B [2 x moe_ffn, r]) and fc2 (A [r, moe_ffn],
    B [h, r]), whole."""
    if rank < 1 or "experts" not in targets or not shape.num_experts:
        return 0
    h, ffn = shape.hidden, shape.moe_ffn
    per_expert = rank * ((h + 2 * ffn) + (ffn + h))
    return shape.num_layers // layout.pp * shape.num_experts // layout.ep * per_expert


def trainer_memory(shape: ModelShape, layout: TrainerLayout, gpu_gib: float, chunk_mb: float,
                   tokens: Optional[int] = None, lora_params: int = 0, lora_expert_params: int = 0) -> TrainerMemory:
    """Per-rank trainer memory for micro-batches of `tokens` (default `max_tokens_per_gpu`); fits is None on CPU
    runs (host RAM, no GPU limit). `lora_params` (adapters on this rank, `lora_params_per_rank`) and
    `lora_expert_params` (the experts' adapters, `lora_expert_params_per_rank`): LoRA RL, where only the adapters
    have gradients and optimizer state (the experts' sharded over the expert data-parallel group)."""
    tokens = tokens or layout.max_tokens_per_gpu
    tp_split, replicated, experts = local_param_counts(shape.split, layout)
    local = tp_split + replicated + experts
    bf16 = layout.precision == "bf16"
    opt_per_param = (4 if bf16 else 0) + 8
    dense_div = layout.dp if layout.distributed_optimizer else 1
    expert_div = layout.expert_dp if layout.distributed_optimizer else 1
    adapters = lora_params + lora_expert_params
    if adapters:  # the frozen base holds weights only
        optimizer = opt_per_param * (lora_params / dense_div + lora_expert_params / expert_div)
        trained = adapters
    else:
        optimizer = opt_per_param * ((tp_split + replicated) / dense_div + experts / expert_div)
        trained = local
    comps = {"weights": (2 if bf16 else 4) * (local + adapters), "grads_fp32": 4 * trained,
             "optimizer": 0.0 if layout.optimizer_cpu_offload else optimizer}
    comps.update(activation_bytes(shape, layout, tokens, chunk_mb, experts))
    gib = {k: v / GIB for k, v in comps.items()}
    gpu = layout.gpus_per_node > 0
    if gpu:
        gib["runtime"] = RUNTIME_OVERHEAD_GIB
    total = sum(gib.values())
    ranks_per_node = min(layout.gpus_per_node or layout.world, layout.world)
    host = optimizer * ranks_per_node / GIB if layout.optimizer_cpu_offload else 0.0
    return TrainerMemory(local_params=local, local_expert_params=experts,
                         components_gib={k: round(v, 3) for k, v in gib.items()}, total_gib=round(total, 3),
                         host_offload_gib_per_node=round(host, 2), fits=(total <= gpu_gib) if gpu else None,
                         tokens_per_micro_batch=tokens, lora_params=adapters)


def engine_memory(shape: ModelShape, config: Any, rollout: RolloutLayout, gpu_gib: float) -> Optional[EngineMemory]:
    """SGLang weights and KV-cache budget per engine GPU; None without SGLang engines on GPUs."""
    if rollout.engine != "sglang" or config.cluster.gpus_per_node == 0:
        return None
    tp = rollout.tp_size
    weights = shape.params_total * 2 * rollout.models_per_engine / tp / GIB
    static = config.sglang.mem_fraction_static * gpu_gib
    kv = static - weights
    kv_heads = max(1, shape.num_kv_heads // tp)
    per_token = shape.num_layers * 2 * kv_heads * shape.head_dim * 2 * rollout.models_per_engine
    tokens = int(kv * GIB // per_token) if kv > 0 else 0
    return EngineMemory(weights_gib=round(weights, 3), static_gib=round(static, 3), kv_cache_gib=round(kv, 3),
                        kv_bytes_per_token=per_token, kv_tokens=tokens, fits=kv > 0)


@dataclass(frozen=True)
class EmbeddedEngineMemory:
    components_mib: dict[str, float]
    total_mib: float
    rows: int


def embedded_engine_memory(shape: ModelShape, config: Any, models: int) -> EmbeddedEngineMemory:
    """Peak tensor memory of the embedded engine over one rollout step (module docstring)."""
    from slime_ext.engine.embedded import PREFIX_CACHE_TOKENS
    from slime_ext.engine.static_kv import PREFILL_ATTENTION_ELEMENTS

    r = config.rollout
    elem = 2 if r.precision == "bf16" else 4
    prompts, rows, p, n_new = r.prompts_per_step, r.prompts_per_step * r.n_samples_per_prompt, r.max_prompt_len, \
        r.max_response_len
    kv = shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * elem * models
    own = OWN_KV_SLOTS
    while own < n_new - 1:  # fed tokens: the last one generated is never fed
        own *= 2
    batch_kv = kv * (prompts * p + rows * own)
    # the last doubling of the own slots holds old and new at once, while the rows are still decoding (the
    # prefix cache has the prompts only); at the end the cache also holds every row's generated tokens
    grow = kv * rows * own // 2 if own > OWN_KV_SLOTS else 0
    cache_prompts = kv * min(PREFIX_CACHE_TOKENS, prompts * p)
    cache = kv * min(PREFIX_CACHE_TOKENS, prompts * p + rows * (n_new - 1))
    logits = rows * shape.vocab * 4 * models
    scores = min(prompts * shape.num_heads * p * p, PREFILL_ATTENTION_ELEMENTS) * 4 * PREFILL_SCORE_COPIES
    prefill = kv * prompts * p + scores
    at_grow, at_end = batch_kv + grow + cache_prompts, batch_kv + cache
    comps = {"weights": shape.params_total * elem * models}
    if prefill > max(at_grow, at_end) + logits:
        comps.update({"prompt_kv": kv * prompts * p, "prefill_scores": scores})
    elif at_grow > at_end:
        comps.update({"batch_kv_while_growing": batch_kv + grow, "prefix_cache": cache_prompts, "logits": logits})
    else:
        comps.update({"batch_kv": batch_kv, "prefix_cache": cache, "logits": logits})
    mib = {k: round(v / 2**20, 2) for k, v in comps.items()}
    return EmbeddedEngineMemory(components_mib=mib, total_mib=round(sum(comps.values()) / 2**20, 2), rows=rows)


def over_memory_problems(trainer: TrainerMemory, engine: Optional[EngineMemory], gpu_gib: float,
                         host_gib: Optional[float], min_kv_tokens: int) -> list[str]:
    """Why a layout cannot fit, each naming the largest terms and the keys that shrink them; [] when it fits."""
    problems = []
    if trainer.fits is False:
        terms = sorted(((v, k) for k, v in trainer.components_gib.items() if v > 0 and k != "runtime"),
                       reverse=True)[:3]
        detail = "; ".join(f"{k} {v:.2f} GiB (shrink with {TRAINER_FIXES.get(k, '?')})" for v, k in terms)
        problems.append(f"trainer needs {trainer.total_gib:.2f} GiB per GPU, more than the {gpu_gib:.0f} GiB of "
                        f"cluster.gpu_memory_gib; largest terms: {detail}")
    if host_gib is not None and trainer.host_offload_gib_per_node > host_gib:
        problems.append(f"the offloaded optimizer needs {trainer.host_offload_gib_per_node:.1f} GiB of host RAM per "
                        f"node, more than cluster.host_memory_gib = {host_gib:.0f} (more nodes, a larger "
                        f"train.parallel.expert_model_parallel_size x data-parallel size, or no "
                        f"train.parallel.optimizer_cpu_offload)")
    if engine is not None:
        problems += engine_pool_problems(engine, min_kv_tokens, "engine", "sglang.mem_fraction_static", ENGINE_FIXES)
    return problems


def engine_pool_problems(engine: EngineMemory, min_kv_tokens: int, what: str, fraction_key: str,
                         fixes: str) -> list[str]:
    """An SGLang server's static pool that cannot hold its weights, or whose KV cache cannot hold one sequence
    (`what`: whose server, `fraction_key`: its mem_fraction_static key, `fixes`: the keys that help)."""
    if not engine.fits:
        return [f"{what} weights {engine.weights_gib:.2f} GiB exceed the static pool {engine.static_gib:.2f} GiB "
                f"({fraction_key} x cluster.gpu_memory_gib): raise {fixes}"]
    if engine.kv_tokens < min_kv_tokens:
        return [f"the {what}'s KV cache holds {engine.kv_tokens} tokens, less than one sequence ({min_kv_tokens}): "
                f"raise {fixes}"]
    return []


def colocated_problems(trainer: TrainerMemory, engine: Optional[EngineMemory], gpu_gib: float, *, colocate: bool,
                       sleep: bool, gpus_per_node: int, sync_buffer_gib: float) -> list[str]:
    """A colocated GPU holds a trainer rank and an engine rank in turn: with both sleeps on (cluster.colocate_sleep)
    it needs the larger of the two plus the sync's buffers (a bucket sent and its received copy); without them
    both stay resident, which the plan refuses. [] on CPU runs, separate engines, or a layout that fits."""
    if not colocate or gpus_per_node == 0 or engine is None:
        return []
    if not sleep:
        return [f"cluster.colocate puts an engine and a trainer rank on each GPU and cluster.colocate_sleep is false, "
                f"so both stay resident: trainer {trainer.total_gib:.2f} GiB + engine static pool "
                f"{engine.static_gib:.2f} GiB per GPU; set cluster.colocate_sleep=true (the engines release weights "
                f"and KV cache while the trainer trains, the trainer offloads during rollouts) or cluster.colocate=false"]
    need = max(trainer.total_gib, engine.static_gib) + sync_buffer_gib
    if need > gpu_gib and trainer.fits is not False and engine.fits is not False:  # else already reported alone
        return [f"a colocated GPU needs max(trainer {trainer.total_gib:.2f}, engine {engine.static_gib:.2f}) + sync "
                f"buffers {sync_buffer_gib:.2f} = {need:.2f} GiB, more than the {gpu_gib:.0f} GiB of "
                f"cluster.gpu_memory_gib: lower sglang.mem_fraction_static or the trainer's terms"]
    return []
