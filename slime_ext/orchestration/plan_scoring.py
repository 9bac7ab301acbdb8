"""The scoring servers' part of a plan (`Method.scoring_servers`: on-policy distillation's teacher on engine servers
of its own): their model's shape, their GPUs and their memory per GPU, and why they would not fit.

A teacher is usually a bigger model than the student, so it gets its own shape (its checkpoint's config.json, or a
model YAML fragment where the checkpoint is not on the planning machine) and its own SGLang memory terms: weights
/ TP, the static pool (`mem_fraction_static` x the GPU), the KV cache what remains. On its own GPUs that is all the
GPU holds; colocated on the rollout engines' GPUs it sits beside the engine's static pool, and when the trainer
shares those GPUs too (cluster.colocate) beside the trainer's peak, since a teacher does not sleep.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from slime_ext.orchestration.memory_model import EngineMemory, TrainerMemory, engine_memory, engine_pool_problems
from slime_ext.orchestration.placement import scoring_servers
from slime_ext.orchestration.plan_layout import RolloutLayout


@dataclass(frozen=True)
class ScoringLayout:
    key: str  # the config key naming the checkpoint
    checkpoint: str
    num_engines: int
    tp_size: int
    placement: str  # own | colocated
    gpus: int  # GPUs of their own (0 when colocated or on CPU)
    shape_source: str  # "checkpoint", "yaml: <file>" or "unknown"
    params_total: int
    memory: Optional[EngineMemory]
    placement_key: str = ""
    mem_key: str = ""


def _teacher_model(config: Any, servers: Any) -> tuple[Optional[Any], str]:
    """The teacher's model section: from its checkpoint's config.json where it exists, else from the YAML fragment
    `servers.shape_config` (its `model:` keys), else None."""
    from slime_ext.config.sections import ModelConfig

    if (Path(servers.checkpoint) / "config.json").is_file():
        return ModelConfig(name=Path(servers.checkpoint).name, hf_path=servers.checkpoint), "checkpoint"
    if servers.shape_config:
        import yaml

        section = (yaml.safe_load(Path(servers.shape_config).read_text()) or {}).get("model") or {}
        return ModelConfig(**{k: v for k, v in section.items() if k != "hf_path"}), f"yaml: {servers.shape_config}"
    return None, "unknown"


def build_scoring(config: Any, rollout: RolloutLayout, gpu_gib: float, warnings: list[str],
                  problems: list[str]) -> Optional[ScoringLayout]:
    """The scoring servers' layout and memory (None when the method has none); what does not fit goes to
    `problems`, a shape the plan cannot know to `warnings` (CPU) or `problems` (GPUs: memory unchecked)."""
    from slime_ext.orchestration.plan_shape import load_model_shape

    servers = scoring_servers(config)
    if servers is None:
        return None
    gpu = config.cluster.gpus_per_node > 0
    model, source = _teacher_model(config, servers)
    params, memory = 0, None
    if model is None:
        msg = (f"{servers.key} = {servers.checkpoint}: no config.json on this machine and no model fragment for its "
               f"architecture, so its memory is not counted; set {servers.key.rsplit('.', 1)[0]}.teacher_model_config "
               "to a model YAML (e.g. configs/models/qwen3-32b.yaml)")
        (problems if gpu else warnings).append(msg)
    else:
        shape, _ = load_model_shape(config.model_copy(update={"model": model}))
        params = shape.params_total
        if shape.num_heads % servers.tp_size:
            problems.append(f"{servers.size_keys}: TP {servers.tp_size} does not divide the teacher's "
                            f"{shape.num_heads} attention heads")
        sglang = config.sglang.model_copy(update={"mem_fraction_static": servers.mem_fraction_static})
        layout = dataclasses.replace(rollout, tp_size=servers.tp_size, models_per_engine=1)
        memory = engine_memory(shape, config.model_copy(update={"sglang": sglang}), layout, gpu_gib)
        if memory is not None:
            seq = config.rollout.max_prompt_len + config.rollout.max_response_len
            problems += engine_pool_problems(memory, seq, "teacher", servers.mem_key,
                                             f"{servers.mem_key} or the teacher's TP ({servers.size_keys})")
    own = servers.placement == "own"
    return ScoringLayout(key=servers.key, checkpoint=servers.checkpoint, num_engines=servers.num_engines,
                         tp_size=servers.tp_size, placement=servers.placement,
                         gpus=servers.num_engines * servers.tp_size if own and gpu else 0, shape_source=source,
                         params_total=params, memory=memory, placement_key=servers.placement_key,
                         mem_key=servers.mem_key)


def colocated_scoring_problems(scoring: Optional[ScoringLayout], trainer: TrainerMemory,
                               engine: Optional[EngineMemory], config: Any, gpu_gib: float) -> list[str]:
    """A teacher on the rollout engines' GPUs never sleeps: its static pool stays beside the engine's, and beside
    the trainer's peak when the trainer shares the GPUs (cluster.colocate; the engine sleeps during training with
    cluster.colocate_sleep)."""
    if scoring is None or scoring.placement != "colocated" or scoring.memory is None or engine is None:
        return []
    teacher = scoring.memory.static_gib
    if config.cluster.colocate:
        rest = max(trainer.total_gib, engine.static_gib) if config.cluster.colocate_sleep else \
            trainer.total_gib + engine.static_gib
        if rest + teacher > gpu_gib:
            return [f"a GPU shared by the trainer, a rollout engine and the teacher needs {rest:.2f} + teacher static "
                    f"pool {teacher:.2f} = {rest + teacher:.2f} GiB, more than the {gpu_gib:.0f} GiB of "
                    f"cluster.gpu_memory_gib: set {scoring.placement_key}=own (GPUs of its own), or lower "
                    f"{scoring.mem_key} or the trainer's terms"]
    elif engine.static_gib + teacher > gpu_gib:
        return [f"a rollout engine GPU holds the engine's static pool {engine.static_gib:.2f} + the teacher's "
                f"{teacher:.2f} GiB, more than {gpu_gib:.0f} GiB: lower sglang.mem_fraction_static or {scoring.mem_key}"]
    return []


__all__ = ["ScoringLayout", "build_scoring", "colocated_scoring_problems"]
