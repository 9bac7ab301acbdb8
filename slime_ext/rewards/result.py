"""The value every verifier returns, and a counter of why samples failed.

A reward of 0 says nothing about *why*; the reason string lets a training step log
"40% no_boxed" and tell a formatting problem from a reasoning one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one response.

    ``reason`` is a short machine-readable tag ("correct", "wrong", "no_boxed", "timeout", ...),
    ``extracted`` the answer/program pulled out of the response (None if nothing was found),
    ``detail`` optional human-readable context (assertion message, stderr tail), already truncated.
    """

    score: float
    reason: str
    extracted: str | None = None
    detail: str | None = None

    @property
    def passed(self) -> bool:
        return self.score > 0.0


class ReasonCounter:
    """Counts reasons over a step so failure modes can be logged as one dict."""

    def __init__(self, results: Iterable[VerifyResult] = ()) -> None:
        self._counts: Counter[str] = Counter()
        for result in results:
            self.add(result)

    def add(self, result: VerifyResult) -> None:
        self._counts[result.reason] += 1

    def merge(self, other: ReasonCounter) -> ReasonCounter:
        """Adds ``other``'s counts into this counter (in place) and returns self."""
        self._counts.update(other._counts)
        return self

    def as_dict(self) -> dict[str, int]:
        return dict(self._counts)

    def total(self) -> int:
        return sum(self._counts.values())

    def __getitem__(self, reason: str) -> int:
        return self._counts[reason]

    def __len__(self) -> int:
        return len(self._counts)

    def __repr__(self) -> str:
        return f"ReasonCounter({dict(self._counts)!r})"
