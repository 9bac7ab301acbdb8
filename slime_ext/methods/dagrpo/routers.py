"""DA-GRPO's router baselines: decide per prompt, before generation, whether to send it to the cloud.

- random router: exactly round(rate x n) prompts, chosen uniformly (seeded);
- trained router classifier: logistic regression (torch, L-BFGS) on prompt features predicting that the
  local model fails; the top round(rate x n) prompts by predicted failure go to the cloud.
Both are scored like DA-GRPO's evaluation: joint accuracy (cloud answers where routed, local elsewhere),
the cloud rate, and local-only accuracy on the prompts kept local.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np
import torch

_NUM = re.compile(r"-?\d+")


def prompt_features(prompt: str) -> np.ndarray:
    """Cheap, task-agnostic difficulty cues: how many numbers, their size, sentences, length."""
    nums = [abs(int(x)) for x in _NUM.findall(prompt)] or [0]
    sentences = max(1, len([s for s in re.split(r"[.?!]", prompt) if s.strip()]))
    return np.array([len(nums), math.log1p(max(nums)), math.log1p(sum(nums)), sentences, len(prompt) / 100.0])


def random_route(n: int, rate: float, seed: int = 0) -> np.ndarray:
    k = int(round(rate * n))
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng(seed).choice(n, size=k, replace=False)] = True
    return mask


def route_by_score(scores: Sequence[float], rate: float) -> np.ndarray:
    """The top round(rate x n) scores go to the cloud (ties broken by position)."""
    scores = np.asarray(scores, dtype=np.float64)
    k = int(round(rate * len(scores)))
    mask = np.zeros(len(scores), dtype=bool)
    mask[np.argsort(-scores, kind="stable")[:k]] = True
    return mask


class LogisticRouter:
    """P(local model fails | prompt features), fitted with L-BFGS on standardised features."""

    def __init__(self, l2: float = 1e-3):
        self.l2 = float(l2)

    def fit(self, features: np.ndarray, local_failed: Sequence[bool]) -> "LogisticRouter":
        x = torch.as_tensor(np.asarray(features, dtype=np.float64))
        self.mu, self.sd = x.mean(0), x.std(0).clamp(min=1e-8)
        x = (x - self.mu) / self.sd
        y = torch.as_tensor(np.asarray(local_failed, dtype=np.float64))
        self.w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
        self.b = torch.zeros((), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([self.w, self.b], max_iter=200, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ self.w + self.b, y) + self.l2 * (self.w ** 2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        return self

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        x = (torch.as_tensor(np.asarray(features, dtype=np.float64)) - self.mu) / self.sd
        with torch.no_grad():
            return torch.sigmoid(x @ self.w + self.b).numpy()


def routed_scores(local_correct: Sequence[float], cloud_correct: Sequence[float], to_cloud: np.ndarray) -> dict[str, float]:
    local, cloud = np.asarray(local_correct, dtype=np.float64), np.asarray(cloud_correct, dtype=np.float64)
    joint = np.where(to_cloud, cloud, local)
    kept = local[~to_cloud]
    return {"joint_accuracy": float(joint.mean()), "cloud_rate": float(to_cloud.mean()),
            "local_only_accuracy": float(kept.mean()) if kept.size else float("nan")}


def routing_probabilities(priority: Sequence[float], rate: float) -> np.ndarray:
    """Each prompt's probability of going to the cloud when exactly round(rate x n) prompts go, highest `priority`
    first and ties broken uniformly at random: the expectation of a seeded router, without its seed's luck. Equal
    priorities everywhere give the random router (every prompt k / n)."""
    priority = np.asarray(priority, dtype=np.float64)
    k = int(round(rate * len(priority)))
    p = np.zeros(len(priority))
    for value in sorted(set(priority.tolist()), reverse=True):
        if k <= 0:
            break
        tied = priority == value
        taken = min(int(tied.sum()), k)
        p[tied] = taken / tied.sum()
        k -= taken
    return p


def expected_routed_correctness(local_correct: Sequence[float], cloud_correct: Sequence[float],
                                to_cloud: Sequence[float]) -> np.ndarray:
    """Per prompt: the expected correctness of a router that sends it to the cloud with probability `to_cloud`."""
    p = np.asarray(to_cloud, dtype=np.float64)
    return p * np.asarray(cloud_correct, dtype=np.float64) + (1 - p) * np.asarray(local_correct, dtype=np.float64)
