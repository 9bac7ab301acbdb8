"""Rollout engines behind one interface: the embedded PyTorch engine and the SGLang client."""

from slime_ext.engine.base import GenerateRequest, GenerateResult, RolloutEngine

__all__ = ["GenerateRequest", "GenerateResult", "RolloutEngine"]
