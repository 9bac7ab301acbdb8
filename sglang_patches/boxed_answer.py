r"""Pull the final ``\boxed{...}`` answer out of a model response.

Brace counting instead of a regex: answers nest braces (``\boxed{\frac{1}{2}}``), and a regex
that tries to match balanced braces backtracks catastrophically on hostile input.
Only the tail of very long responses is scanned, so the cost is bounded whatever the model emits.
It lives on the engine side because both the math verifier (`slime_ext.rewards`) and DUET's engine-side
gate (`sglang_patches.duet`, which must not import `slime_ext`) need the same extractor.
"""

from __future__ import annotations

MAX_SCAN_CHARS = 20_000
"""Only the last this-many characters are scanned: the final answer sits at the end. A longer text
whose only boxes lie before that window gives ``too_long`` rather than ``no_boxed``."""

_COMMANDS = ("\\boxed", "\\fbox")


def open_brace_after(text: str, end: int) -> int:
    r"""Index of the ``{`` that opens the argument of a command ending at ``end``, or -1.

    Rejects longer command names that merely start with ``\boxed``/``\fbox`` (``\fboxsep``).
    """
    n = len(text)
    if end < n and text[end].isalpha():
        return -1
    i = end
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i if i < n and text[i] == "{" else -1


def matching_brace(text: str, open_idx: int) -> int:
    r"""Index of the ``}`` closing the ``{`` at ``open_idx``, or -1. Escaped ``\{``/``\}`` don't count."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip the escaped character (\{, \}, \\)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def find_last_boxed(text: str) -> tuple[str | None, str]:
    r"""Content of the last ``\boxed{}``/``\fbox{}`` and a reason.

    Returns ``(content, "ok")``, ``(None, "no_boxed")``, ``(None, "unbalanced_braces")`` or
    ``(None, "too_long")`` (the text is longer than ``MAX_SCAN_CHARS`` and no box starts in its last
    ``MAX_SCAN_CHARS`` characters, but one starts earlier). The last box is authoritative: if it is
    unterminated (output cut off) we do not fall back to an earlier one, because that earlier box
    was not the model's final answer.
    """
    if not isinstance(text, str) or not text:
        return None, "no_boxed"
    if len(text) <= MAX_SCAN_CHARS:
        return _find_in(text)
    content, why = _find_in(text[-MAX_SCAN_CHARS:])
    if why == "no_boxed" and _mentions_box(text[: len(text) - MAX_SCAN_CHARS + max(map(len, _COMMANDS))]):
        return None, "too_long"
    return content, why


def _mentions_box(head: str) -> bool:
    """Whether a box command occurs in the part of a long text that is not scanned (one linear search)."""
    return any(cmd in head for cmd in _COMMANDS)


def _find_in(text: str) -> tuple[str | None, str]:
    """``find_last_boxed`` on a text that fits the scan window."""
    # Walk candidates from the end. Each command's last position is cached and only searched
    # again once the scan has moved past it, so the total work stays linear in len(text).
    search_end = len(text)
    cached = {cmd: text.rfind(cmd) for cmd in _COMMANDS}
    while search_end > 0:
        for cmd in _COMMANDS:
            if cached[cmd] >= search_end:
                cached[cmd] = text.rfind(cmd, 0, search_end)
        best_cmd = max(_COMMANDS, key=lambda c: cached[c])
        best = cached[best_cmd]
        if best < 0:
            return None, "no_boxed"
        open_idx = open_brace_after(text, best + len(best_cmd))
        if open_idx < 0:
            search_end = best  # e.g. "\boxed" mentioned in prose; look further back
            continue
        close_idx = matching_brace(text, open_idx)
        if close_idx < 0:
            return None, "unbalanced_braces"
        return text[open_idx + 1 : close_idx], "ok"
    return None, "no_boxed"


def extract_last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` or ``\fbox{...}``; None if absent or unbalanced."""
    content, _ = find_last_boxed(text)
    return content
