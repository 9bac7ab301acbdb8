"""Turn groups of samples into the trainer's tensors, keeping every per-token value on its token.

The layout is padded: `[B, T]` rows (prompt + response, right-padded) with an attention mask.

Convention: a value at position t describes token t (so `loss_mask[t] = 1` means "train on the
log-probability of token t", which the trainer computes from the logits at position t-1). Prompt and
padding positions carry loss_mask 0 and logprob 0. Per-token author and channel annotations stay on the
samples: the methods read them there and fold what the loss needs into `loss_mask`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from slime_ext.data.sample import Sample, SampleValidationError


@dataclass
class RolloutBatch:
    """What the trainer reads of one micro-batch (megatron_glue/trainer.py)."""

    sample_ids: list[str]
    tokens: torch.Tensor  # long [B, T]
    position_ids: torch.Tensor  # long, same shape
    seq_index: torch.Tensor  # long, same shape: which sample a position belongs to (-1 = padding)
    loss_mask: torch.Tensor  # float, same shape
    old_logprobs: torch.Tensor  # float, same shape, engine logprobs (0 where absent)
    prompt_lens: torch.Tensor  # long [B]
    response_lens: torch.Tensor  # long [B]
    advantages: torch.Tensor  # float [B]
    token_advantages: torch.Tensor  # float [B, T]: the samples' per-token terms added to `advantages` (0 elsewhere)
    weights: torch.Tensor  # float [B]
    attention_mask: torch.Tensor  # bool [B, T]: False on padding

    def token_advantage(self) -> torch.Tensor:
        """Each token's advantage: its sample's, plus the sample's per-token term where it has one."""
        return self.per_token(self.advantages) + self.token_advantages

    def per_token(self, per_sample: torch.Tensor) -> torch.Tensor:
        """Broadcast a `[B]` per-sample value onto token positions (0 on padding)."""
        idx = self.seq_index.clamp(min=0)
        return torch.where(self.seq_index >= 0, per_sample[idx], torch.zeros((), dtype=per_sample.dtype))


def _flatten(groups: Sequence[Sequence[Sample]] | Sequence[Sample]) -> list[Sample]:
    samples: list[Sample] = []
    for item in groups:
        if isinstance(item, Sample):
            samples.append(item)
        else:
            samples.extend(item)
    return samples


def _round_up(value: int, multiple: int) -> int:
    return ((value + multiple - 1) // multiple) * multiple


def build_batch(
    groups: Sequence[Sequence[Sample]] | Sequence[Sample],
    pad_id: int,
    pad_to_multiple_of: int = 1,
) -> RolloutBatch:
    """Validate samples and lay them out as tensors.

    `pad_to_multiple_of` rounds the sequence dimension up (tensor/sequence parallel splits it).
    """
    samples = _flatten(groups)
    if not samples:
        raise ValueError("cannot build a batch from zero samples")
    seen: set[str] = set()
    for s in samples:
        s.validate()
        if s.sample_id in seen:
            raise SampleValidationError(f"sample id {s.sample_id!r} appears twice in one batch")
        seen.add(s.sample_id)

    lengths = [s.total_len for s in samples]
    rows, width = len(samples), _round_up(max(lengths), pad_to_multiple_of)
    starts = [(i, 0) for i in range(rows)]

    shape = (rows, width)
    tokens = torch.full(shape, pad_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    seq_index = torch.full(shape, -1, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    old_logprobs = torch.zeros(shape, dtype=torch.float32)
    token_advantages = torch.zeros(shape, dtype=torch.float32)

    for i, (s, (row, start)) in enumerate(zip(samples, starts)):
        p, r = len(s.prompt_ids), len(s.response_ids)
        full = slice(start, start + p + r)
        resp = slice(start + p, start + p + r)
        tokens[row, full] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        position_ids[row, full] = torch.arange(p + r)
        seq_index[row, full] = i
        loss_mask[row, resp] = torch.tensor(s.loss_mask, dtype=torch.float32)
        if s.logprobs is not None:
            old_logprobs[row, resp] = torch.tensor(s.logprobs, dtype=torch.float32)
        if s.token_advantages is not None:
            token_advantages[row, resp] = torch.tensor(s.token_advantages, dtype=torch.float32)

    def per_sample(values: list[Optional[float]]) -> torch.Tensor:
        return torch.tensor([0.0 if v is None else float(v) for v in values], dtype=torch.float32)

    return RolloutBatch(
        sample_ids=[s.sample_id for s in samples],
        tokens=tokens,
        position_ids=position_ids,
        seq_index=seq_index,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        prompt_lens=torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.long),
        response_lens=torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long),
        advantages=per_sample([s.advantage for s in samples]),
        token_advantages=token_advantages,
        weights=per_sample([s.weight for s in samples]),
        attention_mask=seq_index >= 0,
    )
