"""The result of `plan.build_plan`: everything a launch would build.

Why a module of its own: the builder (`plan`) and the text (`plan_format`) both need the type, and neither may
import the other back (tests/test_import_rules.py: no import cycles).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from slime_ext.orchestration.memory_model import EmbeddedEngineMemory, EngineMemory, TrainerMemory
from slime_ext.orchestration.placement import ActorGroup, Placement
from slime_ext.orchestration.plan_layout import RolloutLayout, TrainerLayout
from slime_ext.orchestration.plan_scoring import ScoringLayout
from slime_ext.orchestration.plan_shape import ModelShape


@dataclass
class Plan:
    """Everything a launch would build (`build_plan`); `to_dict` is the CLI's `--json`."""

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
    scoring: Optional[ScoringLayout] = None  # the method's scoring servers (a distillation teacher), if any

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
