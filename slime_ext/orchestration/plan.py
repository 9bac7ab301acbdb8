"""The resolved cluster plan of a run config, computed without starting anything.

`python -m slime_ext.orchestration.plan CONFIG [key=value ...] [--json]` prints what a launch would build: nodes and
GPUs, the trainer layout (TP / PP / EP / DP), the rollout engines and the exact command of engine 0,
the Ray actors with their placement-group bundles, and a per-GPU memory estimate compared with the GPU
(H100: 80 GiB). Why: a 30B MoE launch costs many node-minutes before it fails on a layout or memory
mistake; the same numbers checked here fail in a second on a laptop (the launcher's `--dry-run`).

Layout rules (megatron-core 0.16 `initialize_model_parallel`):

* trainer world W (GPUs of the trainer, or processes on CPU), DP = W / (TP * PP), so TP * PP must divide W;
* experts use expert-tensor-parallel ETP = `train.parallel.expert_tensor_parallel_size` (default TP,
  megatron-core's default; 1 = slime's `--expert-tensor-parallel-size 1`, an expert's weights never
  split by TP). megatron-core needs ETP * EP * PP to divide W; the expert data-parallel size is
  EDP = W / (ETP * EP * PP). The reference TP4 / EP8 on 8 GPUs fits only with ETP = 1;
* GPU runs: `train.parallel.data_parallel_size` is derived (W / (TP * PP)); a value other than 1 that
  differs from it is an error. CPU runs (`cluster.gpus_per_node: 0`): W = TP * PP * data_parallel_size
  gloo processes.

Memory model of one trainer GPU (bytes; the heaviest pipeline stage; `ParamSplit` holds the counts):

* parameter split: attention linears, dense MLP, word embedding and output layer are divided by TP
  (vocab-parallel embedding); norms, q/k norms and the MoE router are replicated on every TP rank;
  experts are divided by EP * ETP = EP; a stage holds L / PP layers, the first stage the embedding,
  the last the output layer (both when PP = 1);
* weights: 2 bytes per local parameter in bf16 (4 in fp32);
* gradients: 4 bytes per local parameter (megatron's fp32 grad buffer, `grad_reduce_in_fp32=True`
  as `megatron_glue.trainer` builds it; the buffer is full size even with the distributed optimizer);
* optimizer: fp32 main params (4 bytes, bf16 only) + Adam moments (8 bytes), divided by DP for
  non-expert parameters and by EDP for experts when the distributed optimizer is on; moved to host
  memory (reported per node) when `optimizer_cpu_offload` is on;
* activations for T = `max_tokens_per_gpu` tokens, s = TP with sequence parallel else 1, t = TP,
  bf16 (2 bytes) per element, per token and layer:
    attention: 3 * 2h / s (norm input, residual, projection output)
               + (2 * (q + k + v widths) + 2 * 2 * q width) / t (q, k, v, flash-attention output,
               projection input; no s^2 term with flash attention)
    MoE MLP:   (2h + 8E) / s (norm input, fp32 router logits and probabilities)
               + k * (2h + 2 * 2I + 2I + 2h) / s (routed copies: fc1 input, gate+up, SwiGLU, fc2 output;
               balanced routing, ETP = 1 so I is not split)
    dense MLP: 2h / s + (2 * 2I + 2I) / t
  logits: T * V / t * (2 + 4 + 4) (bf16 logits, fp32 log-softmax kept for backward, fp32 gradient);
  full recompute: P * (L / PP) * T * 2h / s (the bf16 input of every layer is the checkpoint) + one
  layer's activations (recomputed in backward) + logits; none / selective: P * (L / PP) layers of
  activations + logits (selective recompute drops only the s^2 attention term, already absent with
  flash attention); P = PP micro-batches in flight on the first stage (1F1B schedule);
* runtime: a fixed RUNTIME_OVERHEAD_GIB for the CUDA context, NCCL buffers and allocator
  fragmentation (an assumption, not a measurement).

Rollout side of one engine GPU: weights = total parameters * 2 bytes * models per engine / tp_size
(the Tandem method holds the frozen junior next to the senior: two models); SGLang's static pool is
`mem_fraction_static` * GPU memory, the KV cache gets what the weights leave of it; KV bytes per
token = L * 2 (k, v) * max(1, kv_heads / tp_size) * head_dim * 2 bytes. Colocated engines release
their memory during training and the trainer offloads during rollout (slime's colocated mode), so
each phase is compared with the GPU on its own.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from slime_ext.config.loader import ConfigError, load_config
from slime_ext.methods.registry import method_class, method_name
from slime_ext.config.schema import Config, ModelConfig
from slime_ext.orchestration.placement import (ActorGroup, Placement, actor_groups, build_placement, engine_count,
                                              engine_gpus, trainer_world)

GIB = 1024**3
GPU_MEMORY_GIB = 80.0  # H100 80GB
RUNTIME_OVERHEAD_GIB = 4.0  # CUDA context + NCCL buffers + fragmentation: an assumption, see docstring
ENGINE_PORT = 30000


class PlanError(ValueError):
    """A layout that cannot be built; every problem names the config keys to change."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid cluster layout:\n  " + "\n  ".join(self.problems))


# -- model ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSplit:
    """Parameter counts by how the trainer shards them (see the module docstring)."""

    num_layers: int
    attention: int  # per layer: q, k, v, o projections (TP-split)
    replicated: int  # per layer: 2 norms, q/k norms, router (on every TP rank)
    experts: int  # per layer: all experts' gate, up, down (EP-split)
    dense_mlp: int  # per layer: dense gate, up, down (TP-split); 0 for MoE
    embedding: int
    output: int  # 0 when tied
    final_norm: int

    @property
    def total(self) -> int:
        per_layer = self.attention + self.replicated + self.experts + self.dense_mlp
        return self.num_layers * per_layer + self.embedding + self.output + self.final_norm


@dataclass(frozen=True)
class ModelShape:
    """The few architecture numbers the plan needs, read from an HF config."""

    name: str
    source: str  # "hf_path" (checkpoint config.json) or "yaml" (model fields of the config)
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int
    top_k: int
    moe_ffn: int
    dense_ffn: int
    params_total: int
    params_active: int
    split: ParamSplit


def _checkpoint_exists(path: Optional[str]) -> bool:
    return bool(path) and (Path(path) / "config.json").is_file()


def load_model_shape(config: Config) -> tuple[ModelShape, list[str]]:
    """Architecture from the checkpoint's config.json when `model.hf_path` exists, else from the YAML's
    model fields (a dry run on a machine without the checkpoint), with a warning saying so."""
    from megatron_glue.hf_config import hf_config_from_model_config, parameter_counts

    warnings: list[str] = []
    model: ModelConfig = config.model
    source = "hf_path"
    if not _checkpoint_exists(model.hf_path):
        if model.hf_path:
            warnings.append(f"model.hf_path={model.hf_path} does not exist (no config.json): "
                            "using the model fields of the YAML")
        model = model.model_copy(update={"hf_path": None})
        source = "yaml"
    tok_vocab = config.tokenizer.vocab_size if model.vocab_size is None else None
    hf = hf_config_from_model_config(model, tokenizer_vocab=tok_vocab)
    split = param_split(hf)
    counts = parameter_counts(hf)
    if counts["total"] != split.total:  # two independent counts of the same architecture
        raise AssertionError(f"parameter split {split.total} != parameter_counts {counts['total']}")
    experts = _num_experts(hf)
    shape = ModelShape(
        name=config.model.name, source=source, hidden=hf.hidden_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads, num_kv_heads=hf.num_key_value_heads, head_dim=_head_dim(hf),
        vocab=hf.vocab_size, num_experts=experts, top_k=int(getattr(hf, "num_experts_per_tok", 0) or 0),
        moe_ffn=int(getattr(hf, "moe_intermediate_size", 0) or 0), dense_ffn=hf.intermediate_size,
        params_total=counts["total"], params_active=counts["active"], split=split,
    )
    return shape, warnings


def _head_dim(hf: Any) -> int:
    return getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads


def _num_experts(hf: Any) -> int:
    return int(getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", 0) or 0)


def param_split(hf: Any) -> ParamSplit:
    """Count parameters per sharding kind; the sum equals `megatron_glue.hf_config.parameter_counts`."""
    h, hd, experts = hf.hidden_size, _head_dim(hf), _num_experts(hf)
    attention = h * hd * (2 * hf.num_attention_heads + 2 * hf.num_key_value_heads)
    replicated = 2 * h + 2 * hd + experts * h  # input/post-attention norms, q/k norms, router
    expert_params = experts * 3 * h * hf.moe_intermediate_size if experts else 0
    dense = 0 if experts else 3 * h * hf.intermediate_size
    embedding = hf.vocab_size * h
    return ParamSplit(
        num_layers=hf.num_hidden_layers, attention=attention, replicated=replicated, experts=expert_params,
        dense_mlp=dense, embedding=embedding, output=0 if hf.tie_word_embeddings else embedding, final_norm=h,
    )


# -- layout ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerLayout:
    num_nodes: int
    gpus_per_node: int
    total_gpus: int
    world: int  # trainer ranks (GPUs, or gloo processes on CPU)
    tp: int
    pp: int
    ep: int
    etp: int
    dp: int
    expert_dp: int
    sequence_parallel: bool
    recompute: str
    max_tokens_per_gpu: int
    distributed_optimizer: bool
    optimizer_cpu_offload: bool
    precision: str
    backend: str  # nccl / gloo


@dataclass(frozen=True)
class RolloutLayout:
    engine: str  # embedded / sglang
    num_engines: int
    tp_size: int
    engine_gpus: int
    colocate: bool
    router: bool
    models_per_engine: int
    server_command: Optional[list[str]]
    off_policy_steps: int = 0  # 1: rollout t+1 is generated while step t trains (rollout.off_policy_steps)
    partial_rollouts: bool = False
    stale_tokens: str = "mask"


def _check_layout(config: Config, shape: ModelShape, world: int, problems: list[str]) -> None:
    """megatron-core's divisibility rules, each naming the keys to change."""
    par = config.train.parallel
    tp, pp, ep = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.expert_model_parallel_size
    tk, pk, ek = ("train.parallel.tensor_model_parallel_size", "train.parallel.pipeline_model_parallel_size",
                  "train.parallel.expert_model_parallel_size")
    dp = world // (tp * pp)
    etp = par.expert_tensor_parallel_size or tp
    xk = "train.parallel.expert_tensor_parallel_size"
    if world % (tp * pp):
        problems.append(f"{tk} x {pk} = {tp} x {pp} = {tp * pp} does not divide the trainer world of {world} ranks")
    elif etp not in (1, tp):
        problems.append(f"{xk} = {etp}: supported are 1 (experts whole on every TP rank) and the TP size {tp}")
    elif world % (etp * ep * pp):
        hint = " (set it to 1: experts whole on every TP rank)" if etp > 1 and world % (ep * pp) == 0 else ""
        problems.append(f"{ek} x {xk} x {pk} = {ep} x {etp} x {pp} = {ep * etp * pp} does not divide the trainer "
                        f"world of {world} ranks{hint}")
    elif config.cluster.gpus_per_node and par.data_parallel_size not in (1, dp):
        problems.append(f"train.parallel.data_parallel_size = {par.data_parallel_size} but the layout gives "
                        f"DP = world / (TP x PP) = {world} / {tp * pp} = {dp} (leave it at 1: it is derived)")
    if shape.num_experts and shape.num_experts % ep:
        problems.append(f"{ek} = {ep} does not divide the model's {shape.num_experts} experts")
    if not shape.num_experts and ep > 1:
        problems.append(f"{ek} = {ep} but the model has no experts")
    if shape.num_kv_heads % tp or shape.num_heads % tp:
        problems.append(f"{tk} = {tp} does not divide the model's attention heads ({shape.num_heads}) and "
                        f"key/value heads ({shape.num_kv_heads})")
    if shape.num_layers % pp:
        problems.append(f"{pk} = {pp} does not divide the model's {shape.num_layers} layers")


def _check_engines(config: Config, shape: ModelShape, problems: list[str]) -> None:
    if config.rollout.engine != "sglang":
        return
    tp = config.sglang.tp_size
    if shape.num_heads % tp:
        problems.append(f"sglang.tp_size = {tp} does not divide the model's {shape.num_heads} attention heads")


def build_layout(config: Config, shape: ModelShape) -> TrainerLayout:
    """The trainer layout, or PlanError listing every rule the config breaks."""
    problems: list[str] = []
    world = trainer_world(config, problems)
    if not problems:
        _check_layout(config, shape, world, problems)
    _check_engines(config, shape, problems)
    if problems:
        raise PlanError(problems)
    c, par, t = config.cluster, config.train.parallel, config.train
    tp, pp, ep = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.expert_model_parallel_size
    gpu = c.gpus_per_node > 0
    return TrainerLayout(
        num_nodes=c.num_nodes, gpus_per_node=c.gpus_per_node, total_gpus=c.num_nodes * c.gpus_per_node,
        world=world, tp=tp, pp=pp, ep=ep, etp=par.expert_tensor_parallel_size or tp, dp=world // (tp * pp),
        expert_dp=world // (ep * (par.expert_tensor_parallel_size or tp) * pp),
        sequence_parallel=par.sequence_parallel and tp > 1, recompute=par.recompute,
        max_tokens_per_gpu=par.max_tokens_per_gpu, distributed_optimizer=par.use_distributed_optimizer,
        optimizer_cpu_offload=par.optimizer_cpu_offload, precision=t.precision, backend="nccl" if gpu else "gloo",
    )


def _engine_command(config: Config, warnings: list[str]) -> Optional[list[str]]:
    """Engine 0's exact `sglang.launch_server` argv (validated against sglang when it imports)."""
    from slime_ext.engine.sglang_launcher import build_server_command

    if config.rollout.engine != "sglang":
        return None
    model_path = config.sglang.model_path or config.model.hf_path
    if not model_path and "sft" in config.run.stages:
        model_path = "<the SFT warm start>"  # the loop starts the engines from the warm start's HF directory
    if not model_path:
        warnings.append("neither sglang.model_path nor model.hf_path is set: engine command shows a placeholder")
        model_path = "<model.hf_path>"
    host = "0.0.0.0" if config.sglang.num_engines > 1 else "127.0.0.1"
    from slime_ext.engine.engine_server import engine_dtype, server_command

    dtype = engine_dtype(config.rollout.precision)
    if config.cluster.gpus_per_node == 0:  # CPU run: the project's SGLang-protocol server, as the loop starts it
        partner = "<partner checkpoint>" if method_class(config).needs_partner else None
        port = config.sglang.base_port or ENGINE_PORT
        return server_command(config.sglang, model_path, port, threads=config.rollout.threads,
                              partner_dir=partner, use_sglang=False, dtype=dtype)[0]
    saver = config.cluster.colocate and config.cluster.gpus_per_node > 0
    dtype_flag = ["--dtype", dtype] if dtype else []
    try:
        return build_server_command(config.sglang, model_path, ENGINE_PORT, host, enable_memory_saver=saver) + dtype_flag
    except ImportError as exc:
        warnings.append(f"sglang is not importable here ({exc}): engine flags not validated")
        return build_server_command(config.sglang, model_path, ENGINE_PORT, host, enable_memory_saver=saver,
                                    validate=False) + dtype_flag


def build_rollout(config: Config, warnings: list[str]) -> RolloutLayout:
    s = config.sglang
    sglang = config.rollout.engine == "sglang"
    if sglang and s.num_engines > 1 and not s.router:
        warnings.append(f"sglang.num_engines = {s.num_engines} without sglang.router: the client balances the "
                        "engines itself (fewest outstanding requests, a prompt's group on one engine)")
    if sglang and config.cluster.gpus_per_node and s.tp_size > config.cluster.gpus_per_node:
        warnings.append(f"sglang.tp_size = {s.tp_size} spans nodes of {config.cluster.gpus_per_node} GPUs: "
                        "the engine command needs SGLang's multi-node flags")
    num_engines, tp_size = engine_count(config)
    return RolloutLayout(
        engine=config.rollout.engine, num_engines=num_engines,
        tp_size=tp_size, engine_gpus=engine_gpus(config), colocate=config.cluster.colocate,
        router=bool(sglang and s.router), models_per_engine=2 if method_class(config).needs_partner else 1,
        server_command=_engine_command(config, warnings),
        off_policy_steps=config.rollout.off_policy_steps, partial_rollouts=config.rollout.partial_rollouts,
        stale_tokens=config.rollout.stale_token_policy,
    )


# -- Ray actors -----------------------------------------------------------------------------------


# -- memory ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainerMemory:
    local_params: int  # parameters on one GPU of the heaviest stage
    local_expert_params: int
    components_gib: dict[str, float]
    total_gib: float
    host_offload_gib_per_node: float
    fits: Optional[bool]  # None on CPU runs


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


def activation_bytes(shape: ModelShape, layout: TrainerLayout) -> dict[str, int]:
    """Activation memory of one micro-batch of `max_tokens_per_gpu` tokens (formula in the docstring)."""
    T, h, tp = layout.max_tokens_per_gpu, shape.hidden, layout.tp
    s = tp if layout.sequence_parallel else 1
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    per_token = 3 * 2 * h / s + (2 * (q + 2 * kv) + 2 * 2 * q) / tp
    if shape.num_experts:
        routed = 2 * h + 2 * 2 * shape.moe_ffn + 2 * shape.moe_ffn + 2 * h
        per_token += (2 * h + 8 * shape.num_experts) / s + shape.top_k * routed / s
    else:
        per_token += 2 * h / s + (2 * 2 * shape.dense_ffn + 2 * shape.dense_ffn) / tp
    layer = int(T * per_token)
    logits = int(T * math.ceil(shape.vocab / tp) * (2 + 4 + 4))
    layers, inflight = shape.num_layers // layout.pp, layout.pp
    if layout.recompute == "full":
        return {"layer_checkpoints": int(inflight * layers * T * 2 * h / s), "recomputed_layer": layer,
                "logits": logits}
    return {"layers": inflight * layers * layer, "logits": logits}


def trainer_memory(shape: ModelShape, layout: TrainerLayout, gpu_gib: float) -> TrainerMemory:
    """Per-GPU trainer memory (module docstring); fits is None on CPU runs (host RAM, no GPU limit)."""
    tp_split, replicated, experts = local_param_counts(shape.split, layout)
    local = tp_split + replicated + experts
    bf16 = layout.precision == "bf16"
    opt_per_param = (4 if bf16 else 0) + 8
    dense_div = layout.dp if layout.distributed_optimizer else 1
    expert_div = layout.expert_dp if layout.distributed_optimizer else 1
    optimizer = opt_per_param * ((tp_split + replicated) / dense_div + experts / expert_div)
    comps = {"weights": (2 if bf16 else 4) * local, "grads_fp32": 4 * local,
             "optimizer": 0.0 if layout.optimizer_cpu_offload else optimizer}
    comps.update({f"act_{k}": v for k, v in activation_bytes(shape, layout).items()})
    gib = {k: v / GIB for k, v in comps.items()}
    gpu = layout.gpus_per_node > 0
    if gpu:
        gib["runtime"] = RUNTIME_OVERHEAD_GIB
    total = sum(gib.values())
    ranks_per_node = min(layout.gpus_per_node or layout.world, layout.world)
    host = optimizer * ranks_per_node / GIB if layout.optimizer_cpu_offload else 0.0
    return TrainerMemory(local_params=local, local_expert_params=experts,
                         components_gib={k: round(v, 3) for k, v in gib.items()}, total_gib=round(total, 3),
                         host_offload_gib_per_node=round(host, 2), fits=(total <= gpu_gib) if gpu else None)


def engine_memory(shape: ModelShape, config: Config, rollout: RolloutLayout, gpu_gib: float) -> Optional[EngineMemory]:
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


# -- the plan -------------------------------------------------------------------------------------


@dataclass
class Plan:
    method: str
    run_name: str
    model: ModelShape
    layout: TrainerLayout
    rollout: RolloutLayout
    placement: Placement
    actors: list[ActorGroup]
    trainer_memory: TrainerMemory
    engine_memory: Optional[EngineMemory]
    gpu_memory_gib: float
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _layout_warnings(layout: TrainerLayout, config: Config) -> list[str]:
    out = []
    if layout.gpus_per_node and config.train.parallel.data_parallel_size != layout.dp:
        out.append(f"train.parallel.data_parallel_size={config.train.parallel.data_parallel_size} is below the derived "
                   f"DP={layout.dp}: code that sizes the world as TP x PP x data_parallel_size would start "
                   f"{layout.tp * layout.pp * config.train.parallel.data_parallel_size} of {layout.world} ranks; "
                   f"set train.parallel.data_parallel_size={layout.dp}")
    if config.train.parallel.sequence_parallel and layout.tp == 1:
        out.append("train.parallel.sequence_parallel is ignored with TP=1")
    if layout.gpus_per_node and layout.precision != "bf16":
        out.append(f"train.precision={layout.precision} on GPUs: activations are still estimated in bf16")
    return out


def build_plan(config: Config, gpu_memory_gib: float = GPU_MEMORY_GIB) -> Plan:
    """Everything a launch of `config` would build, computed without starting anything."""
    shape, warnings = load_model_shape(config)
    layout = build_layout(config, shape)
    warnings += _layout_warnings(layout, config)
    rollout = build_rollout(config, warnings)
    tmem = trainer_memory(shape, layout, gpu_memory_gib)
    emem = engine_memory(shape, config, rollout, gpu_memory_gib)
    if emem is not None:
        seq = config.rollout.max_prompt_len + config.rollout.max_response_len
        if emem.kv_tokens < seq:
            warnings.append(f"the KV cache holds {emem.kv_tokens} tokens, less than one sequence ({seq})")
    return Plan(method=method_name(config), run_name=config.run.name, model=shape, layout=layout, rollout=rollout,
                placement=build_placement(config), actors=list(actor_groups(config).values()),
                trainer_memory=tmem, engine_memory=emem, gpu_memory_gib=gpu_memory_gib, warnings=warnings)


# -- text -----------------------------------------------------------------------------------------


def _fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _fit(flag: Optional[bool]) -> str:
    return "n/a (CPU run)" if flag is None else ("fits" if flag else "OVER")


def _ranges(indices: list[int]) -> str:
    return f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0]) if indices else "-"


def _format_layout(p: Plan) -> list[str]:
    L, m = p.layout, p.model
    gpus = f"{L.num_nodes} node(s) x {L.gpus_per_node} GPUs = {L.total_gpus} GPUs" if L.gpus_per_node else \
        f"{L.num_nodes} node(s), 0 GPUs (CPU run, {L.world} trainer process(es))"
    return [
        f"plan: method={p.method} run={p.run_name}",
        f"model: {m.name} ({m.source}): {_fmt_params(m.params_total)} params, {_fmt_params(m.params_active)} "
        f"active; {m.num_layers} layers, hidden {m.hidden}, {m.num_heads}/{m.num_kv_heads} heads, "
        f"{m.num_experts} experts top-{m.top_k}, vocab {m.vocab}",
        f"cluster: {gpus}, backend {L.backend}",
        f"trainer: world={L.world} TP={L.tp} PP={L.pp} EP={L.ep} ETP={L.etp} DP={L.dp} expert-DP={L.expert_dp} "
        f"sequence_parallel={L.sequence_parallel} recompute={L.recompute}",
        f"  tokens/GPU={L.max_tokens_per_gpu} precision={L.precision} distributed_optimizer="
        f"{L.distributed_optimizer} optimizer_cpu_offload={L.optimizer_cpu_offload}",
    ]


def _format_schedule(r: RolloutLayout) -> str:
    """How rollout and training interleave (rollout.off_policy_steps, rollout.partial_rollouts)."""
    if not r.off_policy_steps:
        return ("schedule: on-policy: rollout t (weights version t), then train t, then sync version t+1; "
                "rollout and training take turns")
    sync = ("a sync aborts the requests in flight and continues them with the new weights (partial rollouts; "
            f"older tokens: {r.stale_tokens})" if r.partial_rollouts else "the sync waits for rollout t+1 to finish")
    return (f"schedule: one-step off-policy: rollout t+1 runs while step t trains (weights version t, trained at "
            f"step t+1: staleness <= 1); {sync}; the engines need their own GPUs (not colocated)")


def _format_rollout(p: Plan) -> list[str]:
    r = p.rollout
    if r.engine != "sglang":
        return ["rollout: embedded engine (in the rollout manager's process)", "  " + _format_schedule(r)]
    mode = "colocated with the trainer" if r.colocate else "on their own GPUs"
    kind = "SGLang-protocol server(s) (CPU: slime_ext.tools.serve)" if r.engine_gpus == 0 else "SGLang engine(s)"
    lines = [f"rollout: {r.num_engines} {kind} x TP {r.tp_size} = {r.engine_gpus} GPUs, {mode}, "
             f"router {'on' if r.router else 'off'}, {r.models_per_engine} model(s) per engine"]
    lines.append("  " + _format_schedule(r))
    if r.server_command:
        lines.append("  engine 0: " + " ".join(r.server_command))
    return lines


def _format_actors(p: Plan) -> list[str]:
    pl = p.placement
    lines = [f"ray: one placement group, {pl.num_bundles} bundles of {pl.bundle}, {pl.bundles_per_node} per node, "
             f"strategy {pl.strategy}"]
    for a in p.actors:
        flat = [i for b in a.bundles for i in b]
        where = f"bundles {_ranges(flat)}" if flat else "no bundle"
        res = f"{a.resources} each" if a.resources else "no Ray resources"
        lines.append(f"  {a.name} x{a.count}: {res}, {where} ({a.node})")
    return lines


def _format_memory(p: Plan) -> list[str]:
    t, e = p.trainer_memory, p.engine_memory
    unit = f"/ {p.gpu_memory_gib:.0f} GiB" if p.layout.gpus_per_node else "(host RAM per process)"
    parts = ", ".join(f"{k} {v:.2f}" for k, v in t.components_gib.items())
    per = "GPU" if p.layout.gpus_per_node else "process"
    lines = [f"memory trainer per {per}: {t.total_gib:.2f} GiB {unit} -> {_fit(t.fits)}  [{parts}]",
             f"  local params {_fmt_params(t.local_params)} (experts {_fmt_params(t.local_expert_params)})"]
    if t.host_offload_gib_per_node:
        lines.append(f"  optimizer offloaded to host: {t.host_offload_gib_per_node:.1f} GiB per node")
    if e is not None:
        lines.append(f"memory engine per GPU: weights {e.weights_gib:.2f} GiB, static pool {e.static_gib:.2f} GiB, "
                     f"KV cache {e.kv_cache_gib:.2f} GiB = {e.kv_tokens} tokens -> {_fit(e.fits)}")
    return lines


def format_plan(plan: Plan) -> str:
    """The readable multi-line plan the launcher's dry run prints."""
    lines = _format_layout(plan) + _format_rollout(plan) + _format_actors(plan) + _format_memory(plan)
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slime_ext.orchestration.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="YAML run config")
    parser.add_argument("overrides", nargs="*", help="a.b.c=value overrides")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--gpu-mem-gib", type=float, default=GPU_MEMORY_GIB, help="memory of one GPU")
    args = parser.parse_intermixed_args(argv)
    try:
        plan = build_plan(load_config(args.config, args.overrides).config, args.gpu_mem_gib)
    except (ConfigError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
