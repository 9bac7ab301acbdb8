"""Rollout routing replay (R3): the trainer's MoE layers route every token to the experts the rollout engine
chose for it (docs/routing-replay.md).

megatron-core 0.16.1 has the mechanism (`TransformerConfig.moe_enable_routing_replay`: every TopKRouter owns a
`RouterReplay`, whose `get_replay_topk` returns given indices instead of the router's top-k under the actions
REPLAY_FORWARD / REPLAY_BACKWARD). This module feeds it, per micro-batch and per rank:

- layers: a rank holds only its pipeline stage's layers; each TransformerLayer knows its global
  `layer_number` (1-based), so global MoE layer l of the engine's routing goes to the local layer whose
  layer_number is l + 1 (Qwen3-MoE: every layer is a MoE layer);
- token order: megatron routes the hidden states [seq, batch] flattened seq-major; with sequence
  parallelism each TP rank routes its slice of the sequence. The [batch, seq, layers, top_k] grid is
  transposed and sliced accordingly. Expert ids are global ids (expert parallelism dispatches after routing);
- tokens the engine did not route (-1: padding, text spliced in from outside, samples without routing) take
  the router's own top-k: `_PartialRouterReplay.get_replay_topk` merges them row by row. That is the only
  change to megatron's replay (its REPLAY_* paths would gather at index -1);
- recompute: with activation recompute, the routers run again inside backward. megatron's REPLAY_BACKWARD
  pops the targets in the order they were set (`replay_backward_list`, appended by `set_target_indices`),
  which is the order backward recomputes micro-batches in (also under the 1F1B pipeline schedule, where
  several forwards precede the first backward). The subclass takes that path whenever it runs inside the
  autograd engine (backward), so the caller never switches actions; without recompute nothing pops and
  `clear` drops the list after the schedule.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from megatron.core import parallel_state as mpu
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

NOT_ROUTED = -1  # the engine did not route this token: the trainer's router chooses


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class _PartialRouterReplay(RouterReplay):
    """megatron's RouterReplay where target rows holding -1 take the router's own top-k."""

    def get_replay_topk(self, scores: torch.Tensor, topk: int, num_groups: Optional[int] = None,
                        group_topk: Optional[int] = None, default_compute_topk: Any = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        action = self.router_replay_action
        if action not in (RouterReplayAction.REPLAY_FORWARD, RouterReplayAction.REPLAY_BACKWARD):
            return super().get_replay_topk(scores, topk, num_groups, group_topk, default_compute_topk)
        if action == RouterReplayAction.REPLAY_BACKWARD or _in_backward():
            if not self.replay_backward_list:
                raise RuntimeError("routing replay: a router recomputed in backward has no target left")
            target = self.replay_backward_list.pop(0)
        else:
            target = self.target_topk_idx
        target = target.to(scores.device, torch.long)
        if tuple(target.shape) != (scores.shape[0], topk):
            raise ValueError(f"routing replay: target {tuple(target.shape)} for {scores.shape[0]} tokens, top-{topk}")
        free = (target < 0).any(-1)
        if bool(free.any()):
            _, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
            target = torch.where(free[:, None], own, target)
        return scores.gather(1, target), target


def _unwrap(model: Any) -> torch.nn.Module:
    while hasattr(model, "module"):
        model = model.module
    return model


def replay_layers(model: Any) -> dict[int, RouterReplay]:
    """Global MoE layer index (0-based) -> this rank's RouterReplay (built once per model, cached on it)."""
    inner = _unwrap(model)
    found = getattr(inner, "_r3_layers", None)
    if found is not None:
        return found
    found = {}
    for layer in inner.decoder.layers:
        router = getattr(getattr(layer.mlp, "router", None), "router_replay", None)
        if router is None:
            continue
        if not isinstance(router, _PartialRouterReplay):
            router.__class__ = _PartialRouterReplay  # same state; only get_replay_topk differs
        found[int(layer.layer_number) - 1] = router
    if not found:
        raise ValueError("routing replay: the model has no MoE router with replay "
                         "(build it with TransformerConfig.moe_enable_routing_replay=True)")
    inner._r3_layers = found
    return found


def local_targets(routed: torch.Tensor, layer: int, tp_rank: int, tp_size: int, sequence_parallel: bool) -> torch.Tensor:
    """This rank's router input order for one layer: [batch, seq, layers, top_k] -> [tokens, top_k], tokens in
    megatron's [seq, batch] order, the rank's sequence slice under sequence parallelism."""
    per_layer = routed[:, :, layer, :].transpose(0, 1)  # [seq, batch, top_k]
    if sequence_parallel and tp_size > 1:
        seq = per_layer.shape[0]
        if seq % tp_size:
            raise ValueError(f"routing replay: sequence length {seq} not divisible by TP {tp_size}")
        chunk = seq // tp_size
        per_layer = per_layer[tp_rank * chunk : (tp_rank + 1) * chunk]
    return per_layer.reshape(-1, per_layer.shape[-1]).long().contiguous()


def set_targets(model: Any, routed: Optional[torch.Tensor], tokens_shape: tuple[int, int], top_k: int,
                sequence_parallel: bool) -> None:
    """Before a micro-batch's forward: replay `routed` ([batch, seq, moe_layers, top_k], -1 = not routed; None:
    nothing routed, every router chooses) on this rank's MoE layers."""
    layers = replay_layers(model)
    if mpu.get_context_parallel_world_size() > 1:
        raise NotImplementedError("routing replay with context parallelism")
    if routed is None:
        n_layers = max(layers) + 1
        routed = torch.full((*tokens_shape, n_layers, top_k), NOT_ROUTED, dtype=torch.long)
    if tuple(routed.shape[:2]) != tuple(tokens_shape) or routed.shape[3] != top_k:
        raise ValueError(f"routing replay: routed experts {tuple(routed.shape)} do not fit tokens {tuple(tokens_shape)} "
                         f"with top-{top_k}")
    if routed.shape[2] <= max(layers):
        raise ValueError(f"routing replay: routed experts cover {routed.shape[2]} MoE layers, the model has "
                         f"layer {max(layers)}")
    tp_rank, tp_size = mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size()
    for index, replay in layers.items():
        replay.set_target_indices(local_targets(routed, index, tp_rank, tp_size, sequence_parallel))
        replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)


def clear(model: Any) -> None:
    """After the forward-backward schedule: drop targets (and unused backward targets) and the action."""
    for replay in replay_layers(model).values():
        replay.clear_indices()
        replay.clear_router_replay_action()


def record(model: Any, on: bool = True) -> None:
    """Make this rank's routers record their own top-k (RouterReplayAction.RECORD) on the next forwards
    (tests and diagnostics: `recorded` reads them back)."""
    for replay in replay_layers(model).values():
        if on:
            replay.set_router_replay_action(RouterReplayAction.RECORD)
        else:
            replay.clear_router_replay_action()


def recorded(model: Any) -> dict[int, torch.Tensor]:
    """Global MoE layer -> the last recorded top-k [tokens, top_k] (megatron's [seq, batch] token order)."""
    return {i: r.get_recorded_indices() for i, r in replay_layers(model).items()}


def batch_grid(routings: list[Optional[torch.Tensor]], tokens_shape: tuple[int, int]) -> torch.Tensor:
    """Per-sample routed experts ([n_i, layers, top_k], token-aligned from position 0, n_i = total_len - 1 or
    total_len) on the micro-batch's padded token grid [batch, seq, layers, top_k], -1 elsewhere."""
    ref = next(r for r in routings if r is not None)
    grid = torch.full((*tokens_shape, ref.shape[1], ref.shape[2]), NOT_ROUTED, dtype=torch.int16)
    for i, r in enumerate(routings):
        if r is not None:
            n = min(r.shape[0], tokens_shape[1])
            grid[i, :n] = torch.as_tensor(r[:n]).to(torch.int16)
    return grid
