"""DUET's controller state between steps (docs/methods/duet.md): per-prompt signal and length
estimates, the s_floor schedule, the K1/K2 length window, and the unbiasing weights.

All of it is plain data with `state_dict` / `load_state_dict`, so a resumed run continues exactly.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any, Optional, Sequence

import numpy as np


def within_step_sigma(advantages: Sequence[float], seq_logprobs: Sequence[float]) -> Optional[float]:
    """std_i(A_i * sum_l log pi(y_il)) over a prompt's kept, non-aborted rollouts; None below 2."""
    if len(advantages) != len(seq_logprobs):
        raise ValueError(f"{len(advantages)} advantages for {len(seq_logprobs)} sequence logprobs")
    if len(advantages) < 2:
        return None
    return float(np.std(np.asarray(advantages, dtype=np.float64) * np.asarray(seq_logprobs, dtype=np.float64)))


class PromptStats:
    """Running means over steps of each prompt's sigma_q and kept length L_q, and the floor on s_q.

    s_floor is `floor_cold` until the first epoch ends, then the 5th percentile of sigma_q over the
    prompts that have an estimate, frozen from then on.
    """

    def __init__(self, floor_cold: float = 0.01, default_length: float = 256.0, floor_quantile: float = 0.05):
        self.floor_cold = float(floor_cold)
        self.default_length = float(default_length)
        self.floor_quantile = float(floor_quantile)
        self.sigma: dict[str, tuple[float, int]] = {}  # prompt -> (running mean, count)
        self.length: dict[str, tuple[float, int]] = {}
        self.frozen_floor: Optional[float] = None

    @staticmethod
    def _push(table: dict[str, tuple[float, int]], key: str, value: float) -> None:
        mean, n = table.get(key, (0.0, 0))
        table[key] = (mean + (value - mean) / (n + 1), n + 1)

    def observe(self, prompt: str, sigma: Optional[float], kept_lengths: Sequence[int]) -> None:
        if sigma is not None:
            self._push(self.sigma, prompt, sigma)
        for length in kept_lengths:
            self._push(self.length, prompt, float(length))

    def end_epoch(self) -> None:
        """Freeze the floor at the first epoch's end (later calls keep it)."""
        if self.frozen_floor is None and self.sigma:
            self.frozen_floor = float(np.quantile([m for m, _ in self.sigma.values()], self.floor_quantile))

    @property
    def floor(self) -> float:
        return self.frozen_floor if self.frozen_floor is not None else self.floor_cold

    def s(self, prompt: str) -> float:
        return max(self.floor, self.sigma.get(prompt, (0.0, 0))[0])

    def L(self, prompt: str) -> float:
        """q's running mean kept length; cold prompts get the mean over known prompts (else the default)."""
        if prompt in self.length:
            return self.length[prompt][0]
        if self.length:
            return statistics.mean(m for m, _ in self.length.values())
        return self.default_length

    def state_dict(self) -> dict[str, Any]:
        return {"sigma": {k: list(v) for k, v in self.sigma.items()},
                "length": {k: list(v) for k, v in self.length.items()}, "frozen_floor": self.frozen_floor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sigma = {k: (float(v[0]), int(v[1])) for k, v in state["sigma"].items()}
        self.length = {k: (float(v[0]), int(v[1])) for k, v in state["length"].items()}
        self.frozen_floor = state["frozen_floor"]


class LengthWindow:
    """K1 / K2: quantiles of a sliding window of kept rollouts' natural lengths, refit every N steps.

    Cold start: K1 = 0.3 L_max, K2 = 0.7 L_max, until the first refit with data.
    """

    def __init__(self, max_len: int, size: int = 1024, refit_every: int = 10, q1: float = 0.30, q2: float = 0.80):
        self.max_len, self.refit_every, self.q1, self.q2 = int(max_len), int(refit_every), float(q1), float(q2)
        self.window: deque[int] = deque(maxlen=int(size))
        self.k1, self.k2 = int(0.3 * max_len), int(0.7 * max_len)
        self.steps = 0

    def add(self, natural_lengths: Sequence[int]) -> None:
        self.window.extend(int(x) for x in natural_lengths)

    def end_step(self) -> bool:
        """Count a step; refit every `refit_every` steps. Returns whether K1/K2 were refit."""
        self.steps += 1
        if self.steps % self.refit_every or not self.window:
            return False
        data = np.asarray(self.window, dtype=np.float64)
        self.k1 = int(round(float(np.quantile(data, self.q1))))
        self.k2 = max(self.k1, int(round(float(np.quantile(data, self.q2)))))
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"window": list(self.window), "k1": self.k1, "k2": self.k2, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.window.clear()
        self.window.extend(state["window"])
        self.k1, self.k2, self.steps = int(state["k1"]), int(state["k2"]), int(state["steps"])


def unbiasing_weight(did_abort: bool, keep_propensity: float, s_pre: float) -> float:
    """w = (1 - I_abort) / (s_pre * p): an aborted rollout weighs 0; a rollout kept past the gate only
    by the eps coin weighs 1 / (s_pre * eps); one that reached its marker (p = 1) weighs 1 / s_pre."""
    if did_abort:
        return 0.0
    if not 0 < keep_propensity <= 1 or not 0 < s_pre <= 1:
        raise ValueError(f"keep propensity {keep_propensity} and s_pre {s_pre} must lie in (0, 1]")
    return 1.0 / (s_pre * keep_propensity)
