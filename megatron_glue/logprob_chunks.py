"""How many tokens one chunk of the LM head's log-probs holds (`megatron_glue.logprobs`), in a module of its own
that imports neither torch nor megatron.core: the plan's memory model (`slime_ext.orchestration.memory_model`)
sizes the same chunk, and `python -m slime_ext.orchestration.plan` / `--check` need no megatron import for it."""

from __future__ import annotations

DEFAULT_CHUNK_MB = 512.0
FP32_BYTES = 4


def tokens_per_chunk(local_vocab: int, chunk_mb: float) -> int:
    """Tokens whose fp32 logits over this rank's vocabulary slice fit in `chunk_mb` MiB (at least one)."""
    return max(1, int(chunk_mb * 2**20) // (FP32_BYTES * local_vocab))
