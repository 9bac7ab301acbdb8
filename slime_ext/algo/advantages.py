"""Group-relative advantages: each rollout is judged against the other rollouts of its prompt."""

from __future__ import annotations

from typing import Hashable, Sequence

import torch


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    normalize_std: bool = True,
    eps: float = 1e-6,
    unbiased_std: bool = True,
) -> torch.Tensor:
    """`A_i = (R_i - mean R) / (std R + eps)` for one group (std division switchable off).

    `unbiased_std=True` uses the n-1 denominator (torch's default, as slime and verl do). A group of
    one gets advantage 0: there is nothing to compare with.
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.ndim != 1:
        raise ValueError(f"group_advantages expects a 1-D group of rewards, got shape {tuple(r.shape)}")
    if r.numel() <= 1:
        return torch.zeros_like(r)
    centred = r - r.mean()
    if not normalize_std:
        return centred
    return centred / (r.std(unbiased=unbiased_std) + eps)


def grouped_advantages(
    rewards: torch.Tensor | Sequence[float],
    group_ids: Sequence[Hashable],
    normalize_std: bool = True,
    eps: float = 1e-6,
    unbiased_std: bool = True,
) -> torch.Tensor:
    """Advantages for a flat batch whose samples belong to groups (any order, any group sizes)."""
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if len(group_ids) != r.numel():
        raise ValueError(f"{r.numel()} rewards but {len(group_ids)} group ids")
    out = torch.zeros_like(r)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        index = torch.tensor(idx)
        out[index] = group_advantages(r[index], normalize_std, eps, unbiased_std)
    return out
