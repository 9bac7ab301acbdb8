"""Rollout engines behind one interface: the embedded PyTorch engine and the SGLang client."""

from slime_ext.engine.base import RolloutEngine

__all__ = ["RolloutEngine"]
