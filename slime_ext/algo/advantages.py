"""Group-relative advantages: each rollout is judged against the other rollouts of its prompt.

Group statistics are computed in float64 and a group whose rewards are all equal gets advantage exactly
0. In float32 the mean of eight 0.2s is 0.20000002, so the centred rewards are -1.5e-8 and dividing by
the equally tiny std (+ eps) turned a group with no signal into advantages of about -0.015 (collab_grpo's
fixed 0.2 assistance reward produced such groups).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch


def group_advantages(
    rewards: torch.Tensor | Sequence[float],
    normalize_std: bool = True,
    eps: float = 1e-6,
    unbiased_std: bool = True,
) -> torch.Tensor:
    """`A_i = (R_i - mean R) / (std R + eps)` for one group (std division switchable off), as float32.

    `unbiased_std=True` uses the n-1 denominator (torch's default, as slime and verl do). A group of
    one, or a group whose rewards are all equal, gets advantage 0: there is nothing to compare with.
    """
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.ndim != 1:
        raise ValueError(f"group_advantages expects a 1-D group of rewards, got shape {tuple(r.shape)}")
    return _group_advantages_f64(r, normalize_std, eps, unbiased_std).to(torch.float32)


def _group_advantages_f64(r: torch.Tensor, normalize_std: bool, eps: float, unbiased_std: bool) -> torch.Tensor:
    """The group formula on a float64 group; an exactly constant group short-circuits to zeros."""
    if r.numel() <= 1 or bool(r.max() == r.min()):
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
    """Advantages (float32) for a flat batch whose samples belong to groups (any order, any group sizes)."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if len(group_ids) != r.numel():
        raise ValueError(f"{r.numel()} rewards but {len(group_ids)} group ids")
    out = torch.zeros_like(r)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        index = torch.tensor(idx)
        out[index] = _group_advantages_f64(r[index], normalize_std, eps, unbiased_std)
    return out.to(torch.float32)
