"""Rollout data model: samples with per-token annotations and the batches the trainer consumes."""

from slime_ext.data.batch import RolloutBatch, build_batch
from slime_ext.data.sample import Author, Channel, Sample, SampleStatus, SampleValidationError, author_weights

__all__ = ["Author", "Channel", "RolloutBatch", "Sample", "SampleStatus", "SampleValidationError", "author_weights", "build_batch"]
