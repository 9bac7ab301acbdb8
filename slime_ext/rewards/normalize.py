r"""String normalisation of math answers, so that cosmetic differences never cost reward.

Rules (each one exists because models and datasets write the same answer differently):

* math delimiters ``$..$``, ``\(..\)``, ``\[..\]``, a whole-answer ``\boxed{}``, ``\left``/``\right``,
  ``\displaystyle``, spacing commands (``\!``, ``\,``, ``\;``, ``\quad``, ``~``) and ``$`` signs go.
* matrix environments (``pmatrix``, ``bmatrix``, ``Bmatrix``, ``matrix``) -> ``\matrix{a&b;c&d}``;
  ``\dbinom``/``\tbinom`` -> ``\binom``.
* ``\dfrac``/``\tfrac`` -> ``\frac``; brace-less arguments are braced: ``\frac12`` -> ``\frac{1}{2}``,
  ``\sqrt2`` -> ``\sqrt{2}``.
* degrees (``^\circ``, ``°``) are dropped: ``30^\circ`` == ``30``.
* percent signs are dropped here (``50\%`` -> ``50``). ``math_equal`` additionally accepts the
  fraction reading, so ``50%`` equals both ``50`` and ``0.5`` (labels are usually written without %).
* units: a trailing ``\text{..}``/``\mbox{..}``/``\mathrm{..}`` after something containing a digit is
  a unit and is dropped (``5\text{ cm}`` -> ``5``); so is a trailing run of plain words of two or more
  letters after a plain number (``12 apples`` -> ``12``), unless a word is a math word (``2 pi``).
  Single-letter units (``5 m``) are NOT dropped: they cannot be told apart from variables.
  Any other ``\text{X}`` is unwrapped to ``X``.
* a leading single-variable assignment is dropped: ``x = 5`` -> ``5``.
* thousands separators: ``1,000``, ``1{,}000``, ``1\,000`` and ``1 000`` -> ``1000``, but only for
  valid 3-digit groups not adjacent to other commas (``1,000,5`` stays a list).
* spacing: whitespace is removed, except that digits separated only by whitespace that is not a
  valid thousands grouping are read as a list (``1 2`` -> ``1,2``, never ``12``).
* a trailing period and a leading ``+`` go.
"""

from __future__ import annotations

import re

from sglang_patches.boxed_answer import matching_brace, open_brace_after

_MATRIX_ENV_RE = re.compile(r"\\begin\{([pbB]?matrix)\}(.*?)\\end\{\1\}", re.DOTALL)
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_UNICODE = {"\u2212": "-", "\u2013": "-", "\u00d7": "\\times ", "\u00b7": "\\cdot ", "\u03c0": "\\pi ",
            "\u221e": "\\infty ", "\u00a0": " "}
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![A-Za-z])")
_SPACING_RE = re.compile(r"\\(?:[,;:! ]|quad(?![A-Za-z])|qquad(?![A-Za-z]))|~")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])|°")
_TRAILING_UNIT_TEXT_RE = re.compile(
    r"\\(?:text|textrm|mbox|mathrm)\s*\{[^{}]*\}\s*(?:\^\s*\{?\s*\d\s*\}?)?\s*$"
)
_TEXT_WRAP_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mbox|mathrm|mathbf|mathit|operatorname)\s*\{([^{}]*)\}"
)
_ASSIGN_RE = re.compile(r"^\s*(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[A-Za-z0-9]+\}?)?\s*=\s*([^=]+)$")
_SPACE_GROUPS_RE = re.compile(r"(?<![\d.])(\d{1,3})((?: \d{3})+)(?![\d])")
_COMMA_GROUPS_RE = re.compile(r"(?<![\d.,])(\d{1,3})((?:,\d{3})+)(?![\d,])")
_DIGIT_SPACE_DIGIT_RE = re.compile(r"(?<=\d) +(?=\d)")
_WORD_UNIT_RE = re.compile(
    r"^([+-]?\d[\d.]*(?:/\d+)?|[+-]?\\frac\{\d+\}\{\d+\})"  # a plain number
    r" ([A-Za-z]{2,}(?: [A-Za-z]+)*)(?:\^\d)?$"  # followed by words
)
_MATH_WORDS = frozenset(
    {"pi", "sqrt", "sin", "cos", "tan", "log", "ln", "exp", "inf", "infty", "infinity", "oo", "and", "or", "i", "e"}
)
_TOKEN = r"(\d|[A-Za-z]|\\[A-Za-z]+)"
_FRAC_TWO_TOKENS_RE = re.compile(r"\\frac\s*" + _TOKEN + r"\s*" + _TOKEN)
_FRAC_TOKEN_GROUP_RE = re.compile(r"\\frac\s*" + _TOKEN + r"\s*\{")
_FRAC_GROUP_TOKEN_RE = re.compile(r"\\frac\s*\{([^{}]*)\}\s*" + _TOKEN)
_SQRT_TOKEN_RE = re.compile(r"\\sqrt\s*(\d|[A-Za-z](?![A-Za-z])|\\[A-Za-z]+)")
_CMD_BEFORE_LETTER_RE = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_WS_RE = re.compile(r"\s+")
_MAX_PEELS = 4
"""Wrappers/units peeled per kind; bounding the loops keeps hostile nesting linear-time."""


def _matrix_to_command(m: re.Match[str]) -> str:
    r"""``\begin{pmatrix}1&2\\3&4\end{pmatrix}`` -> ``\matrix{1&2;3&4}``, before ``\\`` reads as spacing."""
    rows = [row.strip() for row in m.group(2).split("\\\\")]
    return "\\matrix{" + ";".join(row for row in rows if row) + "}"


def _unwrap_whole_box(s: str) -> str:
    r"""``\boxed{5}`` -> ``5`` when the box spans the whole string (labels are often stored boxed)."""
    for _ in range(_MAX_PEELS):
        for cmd in ("\\boxed", "\\fbox"):
            if s.startswith(cmd) and s.endswith("}"):
                open_idx = open_brace_after(s, len(cmd))
                if open_idx >= 0 and matching_brace(s, open_idx) == len(s) - 1:
                    s = s[open_idx + 1 : -1].strip()
                    break
        else:
            break
    return s


def _strip_delimiters(s: str) -> str:
    for _ in range(_MAX_PEELS):
        before = s
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$").strip()
        for left, right in (("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(left) and s.endswith(right) and len(s) >= 4:
                s = s[2:-2].strip()
        if s == before:
            break
    return s


def _strip_text_units(s: str) -> str:
    r"""Drops trailing ``\text{unit}`` blocks that follow a quantity; unwraps the remaining ``\text``."""
    for _ in range(_MAX_PEELS):
        m = _TRAILING_UNIT_TEXT_RE.search(s)
        if m is None:
            break
        head = s[: m.start()].rstrip()
        if not any(ch.isdigit() for ch in head):
            break
        s = head
    return _TEXT_WRAP_RE.sub(r"\1", s)


def _strip_word_units(s: str) -> str:
    m = _WORD_UNIT_RE.match(s)
    if m is None:
        return s
    words = m.group(2).lower().split(" ")
    if any(w in _MATH_WORDS for w in words):
        return s
    return m.group(1)


def _merge_thousands(s: str) -> str:
    s = _SPACE_GROUPS_RE.sub(lambda m: m.group(1) + m.group(2).replace(" ", ""), s)
    s = _COMMA_GROUPS_RE.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), s)
    return _DIGIT_SPACE_DIGIT_RE.sub(",", s)


def _brace_arguments(s: str) -> str:
    s = _FRAC_TWO_TOKENS_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_TOKEN_GROUP_RE.sub(r"\\frac{\1}{", s)
    s = _FRAC_GROUP_TOKEN_RE.sub(r"\\frac{\1}{\2}", s)
    return _SQRT_TOKEN_RE.sub(r"\\sqrt{\1}", s)


def normalize_answer(s: object) -> str:
    """Canonical string form of an answer (see the module docstring for the rules)."""
    if s is None:
        return ""
    s = _CONTROL_RE.sub("", str(s))
    for src, dst in _UNICODE.items():
        s = s.replace(src, dst)
    s = _strip_delimiters(_unwrap_whole_box(s.strip()))
    s = _MATRIX_ENV_RE.sub(_matrix_to_command, s)
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\displaystyle", "").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\dbinom", "\\binom").replace("\\tbinom", "\\binom")
    s = _LEFT_RIGHT_RE.sub("", s)
    s = _SPACING_RE.sub(" ", s)
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("{,}", ",")
    s = _strip_text_units(s)
    s = _WS_RE.sub(" ", s).strip()
    m = _ASSIGN_RE.match(s)
    if m is not None:
        s = m.group(1).strip()
    s = s.rstrip(". ").strip()
    s = _merge_thousands(s)
    s = _strip_word_units(s)
    s = _brace_arguments(s)
    # Remove whitespace, but keep one space where it ends a command (``2\pi r`` must not become ``\pir``).
    s = _CMD_BEFORE_LETTER_RE.sub(lambda m: m.group(1) + "\x01", s)
    s = _WS_RE.sub("", s).replace("\x01", " ")
    if s.startswith("+"):
        s = s[1:]
    return s
