r"""Multiple-choice verification: find the chosen letter, compare with the label.

Where the answer is looked for, in order: the last ``\boxed{}``; the last "answer (is|:) X"
phrase, else the last "option/choice X" phrase; a parenthesised letter ending the response; a
response that is a lone letter. Only the short answer segment is read (letters joined by
"and"/"or"/commas), so "C because A is wrong" picks C, while "A or C" is ambiguous and scores 0:
rewarding a hedge would teach the policy to list every option.
"""

from __future__ import annotations

import re

from sglang_patches.boxed_answer import extract_last_boxed
from slime_ext.rewards.result import VerifyResult

MAX_SCAN_CHARS = 4000
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# "answer" phrases win over "option"/"choice" ones: "the answer is C. Option B is close" means C.
_MARKER_RES = (
    re.compile(r"\banswer\b(?:\s+is)?\s*[:\-]?", re.IGNORECASE),
    re.compile(r"\b(?:option|choice)\b(?:\s+is)?\s*[:\-]?", re.IGNORECASE),
)
_FINAL_PAREN_RE = re.compile(r"\(([A-Za-z])\)[\s.*_\\$]*$")
_TOKEN_RE = re.compile(r"[A-Za-z]+|\d+|\S")
_SEPARATOR_WORDS = frozenset({"and", "or"})
_FILLER_WORDS = frozenset({"the", "answer", "option", "options", "choice", "choices", "is", "correct", "final"})
_SEPARATOR_CHARS = frozenset(",/&()[]{}*_'\"`$")
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")


def label_to_index(label: object, num_choices: int | None = None) -> int | None:
    """0-based index for a label given as a letter ("C", "(c)") or index (2, "2"); None if invalid."""
    index: int | None = None
    if isinstance(label, bool):
        return None
    if isinstance(label, int):
        index = label
    elif isinstance(label, str):
        text = label.strip().strip("()[]. ")
        if text.isdigit() and text.isascii():
            index = int(text)
        elif len(text) == 1 and text.upper() in _ALPHABET:
            index = _ALPHABET.index(text.upper())
    if index is None or index < 0 or index >= len(_ALPHABET):
        return None
    if num_choices is not None and index >= num_choices:
        return None
    return index


def _letters_in_segment(segment: str) -> tuple[list[str], bool]:
    """Letters named at the start of an answer segment, and whether any were found at all.

    Reads tokens until the first token that is neither a letter, a joiner ("and", "or", ",")
    nor filler ("the answer is"). Lowercase single letters only count when they are the whole
    answer, since "a" is usually the article; "I" followed by a lowercase word is the pronoun.
    """
    segment = _COMMAND_RE.sub(" ", segment)  # \text{C} -> C, \textbf{(B)} -> (B)
    tokens = _TOKEN_RE.findall(segment)
    letters: list[str] = []
    for pos, tok in enumerate(tokens):
        if len(tok) == 1 and tok in _ALPHABET:
            following = tokens[pos + 1] if pos + 1 < len(tokens) else ""
            if tok == "I" and following.islower() and len(following) > 1 and following not in _SEPARATOR_WORDS:
                break  # the pronoun: "option I pick is (A)"
            letters.append(tok)
        elif tok.lower() in _SEPARATOR_WORDS or tok in _SEPARATOR_CHARS:
            continue
        elif tok.lower() in _FILLER_WORDS and not letters:
            continue
        else:
            break
    if not letters:
        meaningful = [t for t in tokens if t not in _SEPARATOR_CHARS and t.lower() not in _FILLER_WORDS]
        if len(meaningful) == 1 and len(meaningful[0]) == 1 and meaningful[0].isalpha():
            letters = [meaningful[0].upper()]
    return letters, bool(letters)


def _decide(letters: list[str]) -> tuple[str | None, str]:
    distinct = sorted(set(letters))
    if not distinct:
        return None, "no_answer"
    if len(distinct) > 1:
        return None, "ambiguous"
    return distinct[0], "ok"


def extract_choice(response: str) -> tuple[str | None, str]:
    """(letter, "ok") or (None, "no_answer" | "ambiguous")."""
    if not isinstance(response, str):
        return None, "no_answer"
    tail = response[-MAX_SCAN_CHARS:]
    boxed = extract_last_boxed(tail)
    if boxed is not None:
        return _decide(_letters_in_segment(boxed)[0])
    for marker_re in _MARKER_RES:
        last = None
        for last in marker_re.finditer(tail):
            pass
        if last is not None:
            segment = re.split(r"[\n.;:!?]", tail[last.end() :], maxsplit=1)[0][:100]
            letters, found = _letters_in_segment(segment)
            if found:
                return _decide(letters)
    stripped = tail.strip()
    m = _FINAL_PAREN_RE.search(stripped[-50:])
    if m is not None:
        return m.group(1).upper(), "ok"
    bare = stripped.strip("*_.()[] \t\n")
    if len(bare) == 1 and bare.upper() in _ALPHABET:
        return bare.upper(), "ok"
    return None, "no_answer"


def verify_choice(response: str, label: object, num_choices: int | None = None) -> VerifyResult:
    """1.0 when the chosen letter matches ``label`` (a letter or a 0-based index, A=0)."""
    try:
        index = label_to_index(label, num_choices)
        if index is None:
            return VerifyResult(0.0, "bad_label")
        letter, why = extract_choice(response)
        if letter is None:
            return VerifyResult(0.0, why)
        chosen = _ALPHABET.index(letter)
        if num_choices is not None and chosen >= num_choices:
            return VerifyResult(0.0, "invalid_choice", letter)
        if chosen == index:
            return VerifyResult(1.0, "correct", letter)
        return VerifyResult(0.0, "wrong", letter)
    except Exception as exc:  # last line of defence: a verifier bug must not kill the run
        return VerifyResult(0.0, "verifier_error", None, detail=f"{type(exc).__name__}: {exc}"[:300])
