"""The trainer and rollout layouts of a plan and the rules a config must follow to build them.

Layout rules (megatron-core 0.16 `initialize_model_parallel`):

* trainer world W (GPUs of the trainer, or processes on CPU), DP = W / (TP * PP), so TP * PP must divide W;
* experts use expert-tensor-parallel ETP = `train.parallel.expert_tensor_parallel_size` (default TP,
  megatron-core's default; 1 = slime's `--expert-tensor-parallel-size 1`, an expert's weights never
  split by TP). megatron-core needs ETP * EP * PP to divide W; the expert data-parallel size is
  EDP = W / (ETP * EP * PP). The reference TP4 / EP8 on 8 GPUs fits only with ETP = 1;
* GPU runs: `train.parallel.data_parallel_size` is derived (W / (TP * PP)); a value other than 1 that
  differs from it is an error. CPU runs (`cluster.gpus_per_node: 0`): W = TP * PP * data_parallel_size
  gloo processes.

A config that breaks a rule raises `PlanError` listing every problem with the keys to change; what is
allowed but worth knowing becomes a warning of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from slime_ext.config.schema import Config
from slime_ext.methods.registry import method_class
from slime_ext.orchestration.placement import engine_count, engine_gpus, trainer_world
from slime_ext.orchestration.plan_engine import engine_command
from slime_ext.orchestration.plan_shape import ModelShape


class PlanError(ValueError):
    """A layout that cannot be built; every problem names the config keys to change."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid cluster layout:\n  " + "\n  ".join(self.problems))


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
    max_staleness: int = 0  # K >= 1: rollouts generated while the trainer trains, tokens <= K versions behind
    stale_groups: str = "wait"
    partial_rollouts: bool = False
    pause_mode: str = "abort"
    stale_tokens: str = "mask"
    weight_sync: str = ""  # the resolved sglang.weight_sync (engine servers only)
    weight_sync_reason: str = ""


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


def build_rollout(config: Config, warnings: list[str]) -> RolloutLayout:
    """The rollout engines (count, TP, GPUs, engine 0's command); what is allowed but worth a look goes to
    `warnings`."""
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
        router=bool(sglang and s.router), models_per_engine=2 if method_class(config).holds_partner(config) else 1,
        server_command=engine_command(config, warnings),
        max_staleness=config.rollout.max_staleness,
        stale_groups=config.rollout.stale_groups, pause_mode=config.rollout.pause_mode, partial_rollouts=config.rollout.partial_rollouts,
        stale_tokens=config.rollout.stale_token_policy,
        weight_sync=s.weight_sync if sglang else "", weight_sync_reason=s.weight_sync_reason(config.cluster.colocate) if sglang else "",
    )


def layout_warnings(layout: TrainerLayout, config: Config) -> list[str]:
    """What a valid trainer layout still should tell the user (a derived DP the config understates, ignored
    flags, the precision the estimate assumes)."""
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
    if config.rollout.asynchronous and config.grpo.mismatch.mode == "none":
        out.append(f"rollout.max_staleness={config.rollout.max_staleness} trains stale tokens without the decoupled "
                   "loss's correction (grpo.mismatch.mode=none): on the default job K=2 ended 8.6 points below "
                   "on-policy and K=2 with IcePop 1.3 above it (results/async_study); set grpo.mismatch.mode=mask")
    return out
