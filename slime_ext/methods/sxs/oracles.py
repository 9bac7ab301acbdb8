"""Entailment oracles for SxS data construction: how many pending answer blocks a reasoning prefix covers.

One interface (`coverage(question, reasoning_prefix, answer_blocks, shown) -> int`, the number of answer
blocks A_1..m entailed, m in [shown, len(answer)]), two implementations:
- `RuleOracle`: deterministic, for the synthetic task whose rows say which reasoning step each answer
  block needs (`requires`);
- `JudgeOracle`: an LLM judge over any OpenAI-compatible chat endpoint (the embedded server, an SGLang
  server), with the "coverage decider" prompt that forbids new derivation, a strict integer parse,
  retries (the client's) and an answer cache keyed by the exact question and blocks (in memory, and in
  a JSONL file when given, so a resumed build does not ask again).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence


class OracleError(RuntimeError):
    """The oracle could not give a usable answer (the message says why)."""


class Oracle(Protocol):
    def coverage(self, question: str, reasoning: Sequence[str], answer: Sequence[str], shown: int,
                 example: Optional[dict] = None) -> int: ...


class RuleOracle:
    """Answer block j is covered once the reasoning prefix includes step `example["requires"][j]`
    (0-based; -1 = needs no reasoning). Blocks are covered in order (a prefix of the answer)."""

    def coverage(self, question: str, reasoning: Sequence[str], answer: Sequence[str], shown: int,
                 example: Optional[dict] = None) -> int:
        requires = (example or {}).get("requires")
        if requires is None or len(requires) != len(answer):
            raise OracleError("the rule oracle needs 'requires' (one reasoning-step index per answer block)")
        m = 0
        while m < len(answer) and requires[m] < len(reasoning):
            m += 1
        return max(m, shown)


JUDGE_SYSTEM = (
    "You are a coverage decider. You are given a question, the reasoning written so far, and a list of "
    "pending answer statements, numbered from 1. Decide how many of the pending statements, counted from "
    "the first and in order, are already fully supported by the reasoning so far. Do not derive anything "
    "new yourself and do not use knowledge beyond the reasoning shown: a statement counts only if the "
    "reasoning already states or directly entails it. Reply with a single integer between 0 and the "
    "number of pending statements, and nothing else."
)


def judge_messages(question: str, reasoning: Sequence[str], pending: Sequence[str]) -> list[dict]:
    listing = "\n".join(f"{i + 1}. {p}" for i, p in enumerate(pending))
    user = (f"Question:\n{question}\n\nReasoning so far:\n" + "\n\n".join(reasoning) +
            f"\n\nPending answer statements ({len(pending)}):\n{listing}\n\nHow many are covered?")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


_INT = re.compile(r"^\s*(\d+)\s*\.?\s*$")


def parse_count(text: str, pending: int) -> int:
    """The judge's reply must be one integer in [0, pending]; anything else is an OracleError."""
    m = _INT.match(text or "")
    if not m:
        raise OracleError(f"judge reply is not a single integer: {text[:80]!r}")
    value = int(m.group(1))
    if value > pending:
        raise OracleError(f"judge reply {value} exceeds the {pending} pending statements")
    return value


class JudgeOracle:
    def __init__(self, client: Any, cache_path: Optional[str | Path] = None, temperature: float = 0.0,
                 max_tokens: int = 8, parse_retries: int = 2):
        self.client, self.temperature, self.max_tokens = client, float(temperature), int(max_tokens)
        self.parse_retries = int(parse_retries)
        self.cache: dict[str, int] = {}
        self.cache_path = Path(cache_path) if cache_path else None
        self._lock = threading.Lock()
        self.calls = 0
        if self.cache_path and self.cache_path.exists():
            for line in self.cache_path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self.cache[row["key"]] = int(row["value"])

    @staticmethod
    def key(question: str, reasoning: Sequence[str], pending: Sequence[str]) -> str:
        blob = json.dumps([question, list(reasoning), list(pending)], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def coverage(self, question: str, reasoning: Sequence[str], answer: Sequence[str], shown: int,
                 example: Optional[dict] = None) -> int:
        pending = list(answer[shown:])
        if not pending:
            return len(answer)
        k = self.key(question, reasoning, pending)
        with self._lock:
            if k in self.cache:
                return shown + self.cache[k]
        last: Optional[Exception] = None
        for attempt in range(self.parse_retries + 1):
            with self._lock:
                self.calls += 1
            reply = self.client.chat(judge_messages(question, reasoning, pending), temperature=self.temperature,
                                     max_tokens=self.max_tokens, seed=attempt)
            try:
                value = parse_count(reply.text, len(pending))
                break
            except OracleError as exc:
                last = exc
        else:
            raise OracleError(f"judge gave no usable count after {self.parse_retries + 1} tries: {last}")
        with self._lock:
            self.cache[k] = value
            if self.cache_path:
                with self.cache_path.open("a") as f:
                    f.write(json.dumps({"key": k, "value": value}) + "\n")
        return shown + value
