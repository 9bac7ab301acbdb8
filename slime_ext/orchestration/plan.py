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

Memory: `slime_ext.orchestration.memory_model` (every term, measured counts, what it leaves out). A layout
whose trainer or engine estimate exceeds `cluster.gpu_memory_gib` (or, with optimizer offload, whose host
share exceeds `cluster.host_memory_gib`) is refused: the CLI prints the plan, then the error naming the terms
and the keys that shrink them, and exits 3 (`--allow-over` prints it without failing).
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
from slime_ext.orchestration.memory_model import (GIB, NOT_COVERED, EmbeddedEngineMemory, EngineMemory, ParamSplit,
                                                 TrainerMemory, _head_dim, _num_experts, embedded_engine_memory,
                                                 engine_memory, over_memory_problems, param_split, trainer_memory)
from slime_ext.orchestration.placement import (ActorGroup, Placement, actor_groups, build_placement, engine_count,
                                              engine_gpus, trainer_world)

GPU_MEMORY_GIB = 80.0  # H100 80GB (cluster.gpu_memory_gib's default)
ENGINE_PORT = 30000


class PlanError(ValueError):
    """A layout that cannot be built; every problem names the config keys to change."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid cluster layout:\n  " + "\n  ".join(self.problems))


# -- model ----------------------------------------------------------------------------------------


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
    memory_problems: list[str] = field(default_factory=list)  # why the layout does not fit (refused by main)
    embedded_engine_memory: Optional[EmbeddedEngineMemory] = None  # CPU runs: the engine process's peak

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


def build_plan(config: Config, gpu_memory_gib: Optional[float] = None) -> Plan:
    """Everything a launch of `config` would build, computed without starting anything. `gpu_memory_gib`
    overrides `cluster.gpu_memory_gib`."""
    gpu_memory_gib = gpu_memory_gib or config.cluster.gpu_memory_gib
    shape, warnings = load_model_shape(config)
    layout = build_layout(config, shape)
    warnings += _layout_warnings(layout, config)
    rollout = build_rollout(config, warnings)
    seq = config.rollout.max_prompt_len + config.rollout.max_response_len
    # the trainer's micro-batches: at most micro_batch_size rows and max_tokens_per_gpu padded tokens, but a
    # longer single sequence still trains (alone)
    tokens = max(seq, min(layout.max_tokens_per_gpu, config.train.micro_batch_size * seq))
    if seq > layout.max_tokens_per_gpu:
        warnings.append(f"one sequence (rollout.max_prompt_len + max_response_len = {seq}) exceeds "
                        f"train.parallel.max_tokens_per_gpu = {layout.max_tokens_per_gpu}: such samples train alone")
    tmem = trainer_memory(shape, layout, gpu_memory_gib, config.train.logprob_chunk_mb, tokens)
    emem = engine_memory(shape, config, rollout, gpu_memory_gib)
    problems = over_memory_problems(tmem, emem, gpu_memory_gib, config.cluster.host_memory_gib, seq)
    embedded = (embedded_engine_memory(shape, config, rollout.models_per_engine)
                if config.cluster.gpus_per_node == 0 else None)
    return Plan(method=method_name(config), run_name=config.run.name, model=shape, layout=layout, rollout=rollout,
                placement=build_placement(config), actors=list(actor_groups(config).values()),
                trainer_memory=tmem, engine_memory=emem, gpu_memory_gib=gpu_memory_gib, warnings=warnings,
                memory_problems=problems, embedded_engine_memory=embedded)


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
             f"  local params {_fmt_params(t.local_params)} (experts {_fmt_params(t.local_expert_params)}), "
             f"micro-batches of {t.tokens_per_micro_batch} tokens (train.parallel.max_tokens_per_gpu)",
             "  not estimated: " + ", ".join(NOT_COVERED)]
    if t.host_offload_gib_per_node:
        lines.append(f"  optimizer offloaded to host: {t.host_offload_gib_per_node:.1f} GiB per node")
    if p.embedded_engine_memory is not None:
        m = p.embedded_engine_memory
        lines.append(f"memory engine per process (one rollout step, {m.rows} rows): {m.total_mib:.1f} MiB  ["
                     + ", ".join(f"{k} {v:.1f}" for k, v in m.components_mib.items()) + "]")
    if e is not None:
        lines.append(f"memory engine per GPU: weights {e.weights_gib:.2f} GiB, static pool {e.static_gib:.2f} GiB, "
                     f"KV cache {e.kv_cache_gib:.2f} GiB = {e.kv_tokens} tokens -> {_fit(e.fits)}")
    return lines


def format_plan(plan: Plan) -> str:
    """The readable multi-line plan the launcher's dry run prints."""
    lines = _format_layout(plan) + _format_rollout(plan) + _format_actors(plan) + _format_memory(plan)
    lines += [f"warning: {w}" for w in plan.warnings]
    lines += [f"does not fit: {p}" for p in plan.memory_problems]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slime_ext.orchestration.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="YAML run config")
    parser.add_argument("overrides", nargs="*", help="a.b.c=value overrides")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--gpu-mem-gib", type=float, default=None,
                        help="memory of one GPU (default: cluster.gpu_memory_gib)")
    parser.add_argument("--allow-over", action="store_true",
                        help="print a plan that does not fit without failing (exit 0)")
    args = parser.parse_intermixed_args(argv)
    try:
        plan = build_plan(load_config(args.config, args.overrides).config, args.gpu_mem_gib)
    except (ConfigError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    if plan.memory_problems and not args.allow_over:
        print("error: the layout does not fit:\n  " + "\n  ".join(plan.memory_problems), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
