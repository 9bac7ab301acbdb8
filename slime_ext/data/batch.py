"""Turn groups of samples into trainer tensors, keeping every per-token annotation on its token.

The layout is padded: `[B, T]` rows (prompt + response, right-padded) with an attention mask.

Convention: an annotation at position t describes token t (so `loss_mask[t] = 1` means "train on the
log-probability of token t", which the trainer computes from the logits at position t-1). Prompt and
padding positions carry loss_mask 0, author/channel -1 and logprob 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Sequence

import torch

from slime_ext.data.sample import Sample, SampleValidationError

NO_ANNOTATION = -1


@dataclass
class RolloutBatch:
    sample_ids: list[str]
    tokens: torch.Tensor  # long [B, T]
    position_ids: torch.Tensor  # long, same shape
    seq_index: torch.Tensor  # long, same shape: which sample a position belongs to (-1 = padding)
    response_mask: torch.Tensor  # bool, same shape: True on response tokens
    loss_mask: torch.Tensor  # float, same shape
    author: torch.Tensor  # long, same shape, -1 where not annotated
    channel: torch.Tensor  # long, same shape, -1 where not annotated
    old_logprobs: torch.Tensor  # float, same shape, engine logprobs (0 where absent)
    prompt_lens: torch.Tensor  # long [B]
    response_lens: torch.Tensor  # long [B]
    advantages: torch.Tensor  # float [B]
    rewards: torch.Tensor  # float [B]
    weights: torch.Tensor  # float [B]
    costs: torch.Tensor  # float [B]
    attention_mask: Optional[torch.Tensor] = None  # bool [B, T]
    missing: Optional[dict[str, list[str]]] = None  # annotation -> ids of samples that lack it

    @property
    def num_samples(self) -> int:
        return len(self.sample_ids)

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        return int((self.seq_index >= 0).sum())

    def require(self, *annotations: str) -> None:
        """Fail closed: raise if any sample lacks an annotation a method depends on."""
        for name in annotations:
            lacking = (self.missing or {}).get(name, [])
            if lacking:
                shown = ", ".join(repr(s) for s in lacking[:5])
                more = f" (+{len(lacking) - 5} more)" if len(lacking) > 5 else ""
                raise SampleValidationError(
                    f"batch needs per-sample '{name}' but {len(lacking)} sample(s) lack it: {shown}{more}"
                )

    def per_token(self, per_sample: torch.Tensor) -> torch.Tensor:
        """Broadcast a `[B]` per-sample value onto token positions (0 on padding)."""
        idx = self.seq_index.clamp(min=0)
        return torch.where(self.seq_index >= 0, per_sample[idx], torch.zeros((), dtype=per_sample.dtype))

    def response_values(self, name: str) -> list[torch.Tensor]:
        """The response-aligned values of one per-token field, split back per sample."""
        tensor = getattr(self, name)
        out = []
        for i in range(self.num_samples):
            positions = (self.seq_index == i) & self.response_mask
            out.append(tensor[positions])
        return out

    def to(self, device: torch.device | str) -> "RolloutBatch":
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = value.to(device) if isinstance(value, torch.Tensor) else value
        return RolloutBatch(**moved)


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
    response_mask = torch.zeros(shape, dtype=torch.bool)
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    author = torch.full(shape, NO_ANNOTATION, dtype=torch.long)
    channel = torch.full(shape, NO_ANNOTATION, dtype=torch.long)
    old_logprobs = torch.zeros(shape, dtype=torch.float32)
    missing: dict[str, list[str]] = {"author": [], "channel": [], "logprobs": [], "advantage": [], "reward": []}

    for i, (s, (row, start)) in enumerate(zip(samples, starts)):
        p, r = len(s.prompt_ids), len(s.response_ids)
        full = slice(start, start + p + r)
        resp = slice(start + p, start + p + r)
        tokens[row, full] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        position_ids[row, full] = torch.arange(p + r)
        seq_index[row, full] = i
        response_mask[row, resp] = True
        loss_mask[row, resp] = torch.tensor(s.loss_mask, dtype=torch.float32)
        for name, target in (("author", author), ("channel", channel)):
            values = getattr(s, name)
            if values is None:
                missing[name].append(s.sample_id)
            else:
                target[row, resp] = torch.tensor(values, dtype=torch.long)
        if s.logprobs is None:
            missing["logprobs"].append(s.sample_id)
        else:
            old_logprobs[row, resp] = torch.tensor(s.logprobs, dtype=torch.float32)
        if s.advantage is None:
            missing["advantage"].append(s.sample_id)
        if s.reward is None:
            missing["reward"].append(s.sample_id)

    attention_mask = seq_index >= 0

    def per_sample(values: list[Optional[float]]) -> torch.Tensor:
        return torch.tensor([0.0 if v is None else float(v) for v in values], dtype=torch.float32)

    return RolloutBatch(
        sample_ids=[s.sample_id for s in samples],
        tokens=tokens,
        position_ids=position_ids,
        seq_index=seq_index,
        response_mask=response_mask,
        loss_mask=loss_mask,
        author=author,
        channel=channel,
        old_logprobs=old_logprobs,
        prompt_lens=torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.long),
        response_lens=torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long),
        advantages=per_sample([s.advantage for s in samples]),
        rewards=per_sample([s.reward for s in samples]),
        weights=per_sample([s.weight for s in samples]),
        costs=per_sample([s.cost for s in samples]),
        attention_mask=attention_mask,
        missing={k: v for k, v in missing.items() if v},
    )
