"""The cloud side of DA-GRPO: one call per prompt group that asked for help, shared by the group.

Any OpenAI-compatible endpoint (`slime_ext.tools.serve` locally; `solver:NAME` is started in-process by
`slime_ext.orchestration.local_endpoints`, an SGLang server or a hosted API on a
cluster) through `OpenAIClient` (timeouts, retries with backoff, a concurrency cap). A call that still
fails is returned as None: the group's help-seeking responses count as unanswered requests (nothing is
spliced), and the failure is counted; the run never crashes on it and no sample is dropped.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

from slime_ext.clients.openai_client import CallFailed

class CloudHelper:
    def __init__(self, client: Any, max_tokens: int = 256, temperature: float = 0.0):
        self.client, self.max_tokens, self.temperature = client, int(max_tokens), float(temperature)
        self.calls = 0
        self.failures = 0
        self._lock = threading.Lock()

    def answer(self, questions: Sequence[Optional[str]]) -> list[Optional[str]]:
        """One completion per non-None question (groups that asked), None elsewhere or on failure."""
        wanted = [i for i, q in enumerate(questions) if q is not None]
        out: list[Optional[str]] = [None] * len(questions)
        if not wanted:
            return out
        convs = [[{"role": "user", "content": questions[i]}] for i in wanted]
        results = self.client.chat_many(convs, max_tokens=self.max_tokens, temperature=self.temperature, seed=0)
        with self._lock:
            self.calls += len(wanted)
            for i, res in zip(wanted, results):
                if isinstance(res, CallFailed) or isinstance(res, Exception):
                    self.failures += 1
                else:
                    out[i] = res.text
        return out
