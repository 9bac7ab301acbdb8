"""Code verification: take the last fenced code block and run it against assert-based tests.

The response's *last* block is the model's final program; earlier blocks are drafts or examples.
An unterminated last fence means the output was cut off, so nothing is run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slime_ext.rewards.code_sandbox import run_sandboxed
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


def _join_tests(tests: str | Sequence[str]) -> str:
    if isinstance(tests, str):
        return tests
    return "\n".join(str(t) for t in tests)


def verify_code(
    response: str,
    tests: str | Sequence[str],
    time_limit_s: float = 5.0,
    memory_limit_mb: int = 512,
) -> VerifyResult:
    """Runs the response's last code block followed by ``tests`` (assert statements) in a sandbox."""
    try:
        code = extract_code_block(response)
        if not code:
            return VerifyResult(0.0, "no_code_block")
        if len(code) > MAX_CODE_CHARS:
            return VerifyResult(0.0, "too_long")
        test_src = _join_tests(tests)
        if not test_src.strip():
            return VerifyResult(0.0, "bad_label", code)
        outcome = run_sandboxed(code, test_src, time_limit_s, memory_limit_mb)
        score, reason = _STATUS_TO_RESULT.get(outcome.status, (0.0, "runtime_error"))
        detail = outcome.message[:MAX_MESSAGE_CHARS]
        if score == 0.0 and outcome.stderr.strip():
            detail += "\n--- stderr (tail) ---\n" + outcome.stderr[-MAX_STDERR_CHARS:]
        return VerifyResult(score, reason, code, detail=detail)
    except Exception as exc:  # last line of defence: a verifier bug must not kill the run
        return VerifyResult(0.0, "verifier_error", None, detail=f"{type(exc).__name__}: {exc}"[:300])
