"""Code verification: take the last fenced code block and run it against assert-style tests.

The response's *last* block is the model's final program; earlier blocks are drafts or examples.
An unterminated last fence means the output was cut off, so nothing is run.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from typing import Any

from slime_ext.rewards.code_checks import TestPlan, UnsupportedTests, check_passes, plan_tests
from slime_ext.rewards.code_sandbox import RawOutcome, run_candidate
from slime_ext.rewards.result import VerifyResult

MAX_SCAN_CHARS = 200_000
MAX_CODE_CHARS = 100_000
MAX_MESSAGE_CHARS = 500
MAX_STDERR_CHARS = 1500

_FENCE_RE = re.compile(r"`{3,}")
_INFO_STRING_RE = re.compile(r"[\w+#.\-]*")

_STATUS_TO_RESULT = {
    "ok": (1.0, "correct"),
    "tests_failed": (0.0, "tests_failed"),
    "runtime_error": (0.0, "runtime_error"),
    "memory_limit": (0.0, "memory_limit"),
    "time_limit": (0.0, "time_limit"),
}


def extract_code_block(text: str) -> str | None:
    """Body of the last fenced (```) block, without its language tag; None if absent or unterminated."""
    if not isinstance(text, str):
        return None
    text = text[-MAX_SCAN_CHARS:]
    fences = list(_FENCE_RE.finditer(text))
    if not fences or len(fences) % 2:
        return None  # no block, or the last one was never closed
    opening, closing = fences[-2], fences[-1]
    start = opening.end()
    newline = text.find("\n", start, closing.start())
    if newline >= 0 and _INFO_STRING_RE.fullmatch(text[start:newline].strip()):
        start = newline + 1  # skip "python", "py", "" ...
    body = text[start : closing.start()]
    return body.rstrip() + "\n" if body.strip() else ""


def _memory(message: str) -> bool:
    return "MemoryError" in message


def _looks_like_oom(stderr: str) -> bool:
    return any(s in stderr for s in ("MemoryError", "Cannot allocate memory", "bad_alloc", "out of memory"))


def judge(plan: TestPlan, outcome: RawOutcome, time_limit_s: float) -> tuple[str, str]:
    """(status, message) decided here, from the candidate's plain-data values; never by the candidate.

    status: "ok", "tests_failed", "runtime_error", "memory_limit" or "time_limit".
    """
    results: dict[int, dict[str, Any]] = {}
    done = False
    for record in outcome.records:
        if "phase" in record:  # the program or a setup statement raised
            message = str(record.get("error", ""))
            return ("memory_limit" if _memory(message) else "runtime_error"), message
        if record.get("done") is True:
            done = True
            break
        if isinstance(record.get("id"), int):
            results.setdefault(record["id"], record)
    if not done:
        rc = outcome.returncode
        if outcome.timed_out:
            return "time_limit", f"wall-clock limit of {time_limit_s:g}s exceeded"
        if rc in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            return "time_limit", f"CPU limit exceeded (exit status {rc})"
        if _looks_like_oom(outcome.stderr):
            return "memory_limit", "out of memory"
        return "runtime_error", f"exited with code {rc} before the tests completed"
    for check in plan.checks:
        record = results.get(check.index)
        where = check.source + (f": {check.message}" if check.message else "")
        if record is None:
            return "runtime_error", f"no result for {check.source}"
        if "error" in record:
            message = str(record["error"])
            if message.startswith("NotPlainData"):
                return "tests_failed", f"{where} ({message})"
            return ("memory_limit" if _memory(message) else "runtime_error"), f"tests: {message} in {check.source}"
        passed, why = check_passes(check, record.get("values"))  # type: ignore[arg-type]
        if not passed:
            return "tests_failed", where + (f" ({why})" if why else "")
    return "ok", ""


def verify_code(
    response: str,
    tests: str | Sequence[str],
    time_limit_s: float = 5.0,
    memory_limit_mb: int = 512,
) -> VerifyResult:
    """Runs the response's last code block against assert-style ``tests`` in the sandbox.

    The candidate's process evaluates only the call side of each assert; the comparison with the
    expected side happens here (see ``code_checks``), so the candidate never holds an expected value.
    """
    try:
        code = extract_code_block(response)
        if not code:
            return VerifyResult(0.0, "no_code_block")
        if len(code) > MAX_CODE_CHARS:
            return VerifyResult(0.0, "too_long")
        try:
            plan = plan_tests(tests)
        except UnsupportedTests as exc:
            return VerifyResult(0.0, "bad_label", code, detail=str(exc)[:MAX_MESSAGE_CHARS])
        outcome = run_candidate(code, list(plan.steps), time_limit_s, memory_limit_mb)
        status, message = judge(plan, outcome, time_limit_s)
        score, reason = _STATUS_TO_RESULT.get(status, (0.0, "runtime_error"))
        detail = message[:MAX_MESSAGE_CHARS]
        if score == 0.0 and outcome.stderr.strip():
            detail += "\n--- stderr (tail) ---\n" + outcome.stderr[-MAX_STDERR_CHARS:]
        return VerifyResult(score, reason, code, detail=detail)
    except Exception as exc:  # last line of defence: a verifier bug must not kill the run
        return VerifyResult(0.0, "verifier_error", None, detail=f"{type(exc).__name__}: {exc}"[:300])
