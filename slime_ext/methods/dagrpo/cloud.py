"""The cloud side of DA-GRPO: one call per prompt group that asked for help, shared by the group.

Any OpenAI-compatible endpoint (`slime_ext.tools.serve` locally; `solver:NAME` is started in-process by
`slime_ext.orchestration.local_endpoints`, an SGLang server or a hosted API on a
cluster) through `OpenAIClient` (timeouts, retries with backoff, a concurrency cap, a circuit breaker).
A call that still fails, or that the open breaker skips, is returned as None: the group's help-seeking
responses count as unanswered requests (nothing is spliced), and the call is counted as failed or
skipped; the run never crashes on it and no sample is dropped. `ask` returns the counts of one batch
(`CloudTally`), so each training step and each evaluation reports its own failure rate.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from slime_ext.clients.openai_client import CallFailed, CallSkipped

log = logging.getLogger(__name__)


@dataclass
class CloudTally:
    """Cloud calls of one batch: made (or meant), failed after their attempts, skipped by the breaker."""

    calls: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def unanswered(self) -> int:
        return self.failed + self.skipped

    @property
    def failure_rate(self) -> float:
        """Share of calls that got no answer (failed or skipped); 0 when nothing was asked."""
        return self.unanswered / self.calls if self.calls else 0.0

    def __add__(self, other: "CloudTally") -> "CloudTally":
        return CloudTally(self.calls + other.calls, self.failed + other.failed, self.skipped + other.skipped)

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}calls": float(self.calls), f"{prefix}failures": float(self.failed),
                f"{prefix}skipped": float(self.skipped), f"{prefix}failure_rate": self.failure_rate}


def warn_if_cloud_degraded(tally: CloudTally, warn_rate: float, where: str) -> bool:
    """Log a warning when more than `warn_rate` of `where`'s cloud calls got no answer; return whether."""
    degraded = tally.calls > 0 and tally.failure_rate > warn_rate
    if degraded:
        log.warning("DA-GRPO %s: %d of %d cloud calls got no answer (%d failed, %d skipped by the open circuit "
                    "breaker; %.0f%% > dagrpo.cloud_failure_warn_rate %.0f%%); their help requests count as "
                    "unanswered. Check dagrpo.cloud_url and the endpoint's health", where, tally.unanswered,
                    tally.calls, tally.failed, tally.skipped, 100 * tally.failure_rate, 100 * warn_rate)
    return degraded


class CloudHelper:
    def __init__(self, client: Any, max_tokens: int = 256, temperature: float = 0.0):
        self.client, self.max_tokens, self.temperature = client, int(max_tokens), float(temperature)
        self.calls = 0
        self.failures = 0  # calls attempted that got no answer
        self.skipped = 0  # calls the open circuit breaker refused (no attempt made)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Picklable (the method is handed to the rollout manager actor): all but the lock."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def ask(self, questions: Sequence[Optional[str]]) -> tuple[list[Optional[str]], CloudTally]:
        """One completion per non-None question (groups that asked), None elsewhere or when the call
        failed or was skipped; with this batch's counts."""
        wanted = [i for i, q in enumerate(questions) if q is not None]
        out: list[Optional[str]] = [None] * len(questions)
        tally = CloudTally(calls=len(wanted))
        if not wanted:
            return out, tally
        convs = [[{"role": "user", "content": questions[i]}] for i in wanted]
        results = self.client.chat_many(convs, max_tokens=self.max_tokens, temperature=self.temperature, seed=0)
        for i, res in zip(wanted, results):
            if isinstance(res, CallSkipped):
                tally.skipped += 1
            elif isinstance(res, (CallFailed, Exception)):
                tally.failed += 1
            else:
                out[i] = res.text
        with self._lock:
            self.calls += tally.calls
            self.failures += tally.failed
            self.skipped += tally.skipped
        return out, tally

    def answer(self, questions: Sequence[Optional[str]]) -> list[Optional[str]]:
        """`ask` without the counts."""
        return self.ask(questions)[0]
