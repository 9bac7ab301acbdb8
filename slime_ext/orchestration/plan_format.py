"""The plan as readable text: the multi-line summary `python -m slime_ext.orchestration.plan` and the
launchers' dry run print."""

from __future__ import annotations

from typing import Optional

from slime_ext.orchestration.memory_model import NOT_COVERED
from slime_ext.orchestration.plan_layout import RolloutLayout
from slime_ext.orchestration.plan_types import Plan


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
    """How rollout and training interleave (rollout.max_staleness, stale_groups, partial_rollouts)."""
    k = r.max_staleness
    if not k:
        return ("schedule: on-policy: rollout t (weights version t), then train t, then sync version t+1; "
                "rollout and training take turns")
    how = {"abort": "aborts the requests in flight and continues them", "retract": "retracts the requests in flight "
           "in the engines (/pause_generation retract) and continues them", "in_place": "pauses the requests in "
           "flight in place (/pause_generation in_place, KV kept) and continues them"}[r.pause_mode]
    sync = (f"a sync {how} with the new weights (partial rollouts; older tokens: {r.stale_tokens})"
            if r.partial_rollouts else "a sync waits for the rollout in flight")
    ahead = (f"a rollout starts once its weights are at most {k} version(s) behind the step that trains it"
             if r.stale_groups == "wait" else
             f"up to {k + 1} rollouts ahead of the trainer, those more than {k} version(s) behind dropped")
    return (f"schedule: asynchronous (max_staleness {k}): rollouts run while the trainer trains, {ahead}; {sync}; "
            "the engines need their own GPUs (not colocated)")


def _format_rollout(p: Plan) -> list[str]:
    r = p.rollout
    if r.engine != "sglang":
        return ["rollout: embedded engine (in the rollout manager's process)", "  " + _format_schedule(r)]
    mode = "colocated with the trainer" if r.colocate else "on their own GPUs"
    kind = "SGLang-protocol server(s) (CPU: slime_ext.tools.serve)" if r.engine_gpus == 0 else "SGLang engine(s)"
    lines = [f"rollout: {r.num_engines} {kind} x TP {r.tp_size} = {r.engine_gpus} GPUs, {mode}, "
             f"router {'on' if r.router else 'off'}, {r.models_per_engine} model(s) per engine"]
    lines.append("  " + _format_schedule(r))
    lines.append(f"  weight sync: {r.weight_sync} ({r.weight_sync_reason})")
    if r.server_command:
        lines.append("  engine 0: " + " ".join(r.server_command))
    return lines + _format_scoring(p)


def _format_scoring(p: Plan) -> list[str]:
    s = p.scoring
    if s is None:
        return []
    where = f"{s.gpus} GPUs of their own" if s.placement == "own" else "on the rollout engines' GPUs"
    if not p.layout.gpus_per_node:
        where = "CPU processes"
    size = f"{_fmt_params(s.params_total)} params" if s.params_total else "size unknown"
    lines = [f"scoring: {s.num_engines} server(s) x TP {s.tp_size} for {s.key} ({s.checkpoint}; {size}, shape from "
             f"{s.shape_source}), {where}, prefill-only, never synced"]
    m = s.memory
    if m is not None:
        lines.append(f"  memory per teacher GPU: weights {m.weights_gib:.2f} GiB, static pool {m.static_gib:.2f} GiB, "
                     f"KV cache {m.kv_cache_gib:.2f} GiB = {m.kv_tokens} tokens -> {_fit(m.fits)}")
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
    if t.lora_params:
        lines.append(f"  LoRA: {_fmt_params(t.lora_params)} adapter params per GPU train (gradients and optimizer state "
                     "for these only; the base is frozen)")
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
