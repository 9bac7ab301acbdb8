"""Engine failures the training loop turns into a clean stop (checkpoint intact, resume command)."""

from __future__ import annotations


class EngineFailure(RuntimeError):
    """The rollout engines cannot go on (restarts exhausted, weights not delivered, stale rollouts)."""


class EngineUnavailable(EngineFailure):
    """An engine server died or stopped answering and its restarts are used up."""


class WeightSyncError(EngineFailure):
    """New weights did not reach every engine: training on would use stale rollouts."""


class StaleRollout(EngineFailure):
    """A rollout was generated with weights other than the step's."""


__all__ = ["EngineFailure", "EngineUnavailable", "WeightSyncError", "StaleRollout"]
