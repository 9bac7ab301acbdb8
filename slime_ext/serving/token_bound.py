"""How many characters one token can cover, so that a prompt that cannot fit the token limit is refused
by its length alone, and the default request-size cap that follows from the context length.

Why: tokenising costs time and memory in proportion to the text (+1 GB peak RSS and 5-6 s for a 3.9 MiB
body of random words with this project's tokenizer, measured with tests/serving/serve_memory_probe.py;
docs/serving.md has the table). If no token can stand for more than `M` characters of the prompt,
a prompt of `n` tokens has at most `n * M` characters, so a text longer than `limit * M` has more than
`limit` tokens and is refused without tokenising; any text that is tokenised is at most `limit * M`
characters long.

The bound `M` is the longest vocabulary entry (added and special tokens included) in the tokenizer's
own spelling, times what the normalizer can shrink a text by. In that spelling one character stands for
one byte (byte-level BPE: `Ġ` is a space) or one character (SentencePiece's `▁`, plain BPE), or more
(`<0x41>` byte-fallback pieces, `##` prefixes), never less, and a character of text is at least one
byte; so each token covers at most its entry's length in characters of the normalized text. It holds
only where no step of the pipeline drops or fuses characters: tokenizers with a normalizer that removes
characters (Strip, BertNormalizer, StripAccents, Precompiled), a pre-tokenizer that drops whitespace or
delimiters (Whitespace, BertPreTokenizer, Split "removed"), a model that fuses unknown runs into one
token (WordPiece, WordLevel, BPE/Unigram with a fused unknown token and no byte fallback) or added tokens
that swallow whitespace (`lstrip`/`rstrip`) get no bound (None): the server then tokenises as before,
bounded only by the request-size cap.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

DEFAULT_REQUEST_BYTES = 4 << 20  # the cap without a token bound or a context length (the exact solver)
# A character of a JSON string takes at most 12 bytes: a code point outside the BMP written as an escaped
# surrogate pair, "\ud83d\ude00" (6 bytes per BMP character as "\u00e9"; 4 as raw UTF-8).
JSON_BYTES_PER_CHAR = 12
REST_OF_BODY_BYTES = 64 << 10  # the other fields (sampling parameters, stop strings, message keys)
# NFC/NFKC compose at most 4 code points into one (U+1F82 = U+03B1 U+0313 U+0300 U+0345, the longest
# canonical decomposition in Unicode 14; tests/serving/test_serve_token_bound.py checks it).
MAX_COMPOSED = 4
_KEEPS_EVERY_CHAR = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "Sequence"}
_SHRINK_FREE_NORMALIZERS = {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"}


def max_chars_per_token(tokenizer: Any) -> Optional[int]:
    """At most this many characters of a prompt become one token; None where no sound bound is known.

    A tokenizer may declare it (`max_chars_per_token`, e.g. one code point per token); an HF fast
    tokenizer gets it from its vocabulary and pipeline (see the module docstring)."""
    declared = getattr(tokenizer, "max_chars_per_token", None)
    if declared is not None:
        return int(declared)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(tokenizer, "get_vocab"):
        return None
    spec = json.loads(backend.to_str())
    vocab = tokenizer.get_vocab()  # added and special tokens included
    shrink = normalizer_shrink(spec.get("normalizer"))
    if shrink is None or not vocab or not keeps_every_char(spec.get("pre_tokenizer")) or \
            not model_never_fuses(spec["model"], vocab) or swallows_whitespace(spec.get("added_tokens") or []):
        return None
    return max(map(len, vocab)) * shrink


def normalizer_shrink(spec: Optional[dict[str, Any]]) -> Optional[int]:
    """How many characters of text the normalizer can turn into one (None: it can remove characters)."""
    if spec is None:
        return 1
    kind = spec.get("type")
    if kind in _SHRINK_FREE_NORMALIZERS:
        return 1
    if kind in ("NFC", "NFKC"):
        return MAX_COMPOSED
    if kind == "Replace":
        pattern, content = spec.get("pattern", {}).get("String"), spec.get("content") or ""
        return math.ceil(len(pattern) / len(content)) if pattern and content else None
    if kind == "Sequence":
        shrink = 1
        for part in spec.get("normalizers", []):
            factor = normalizer_shrink(part)
            if factor is None:
                return None
            shrink *= factor
        return shrink
    return None


def keeps_every_char(spec: Optional[dict[str, Any]]) -> bool:
    """The pre-tokenizer splits (and byte-maps) the text but drops none of it."""
    if spec is None:
        return True
    kind = spec.get("type")
    if kind not in _KEEPS_EVERY_CHAR or str(spec.get("behavior", "")).lower() == "removed":
        return False
    return kind != "Sequence" or all(keeps_every_char(p) for p in spec.get("pretokenizers", []))


def model_never_fuses(spec: dict[str, Any], vocab: dict[str, int]) -> bool:
    """Every token the model emits is a vocabulary entry covering at most its own spelling."""
    kind = spec.get("type")
    bytes_fall_back = bool(spec.get("byte_fallback")) and all(f"<0x{b:02X}>" in vocab for b in range(256))
    if kind == "BPE":
        return bytes_fall_back or spec.get("unk_token") is None or not spec.get("fuse_unk")
    if kind == "Unigram":  # fuses unknown characters into one token unless they fall back to bytes
        return bytes_fall_back
    return False  # WordPiece / WordLevel: a whole unknown word is one [UNK]


def swallows_whitespace(added_tokens: list[dict[str, Any]]) -> bool:
    """An added token with lstrip/rstrip takes any run of whitespace beside it into the one token."""
    return any(t.get("lstrip") or t.get("rstrip") for t in added_tokens)


def prompt_char_limit(max_tokens: Optional[int], chars_per_token: Optional[int]) -> Optional[int]:
    """The longest text that can still be `max_tokens` tokens (None: no limit known)."""
    if max_tokens is None or chars_per_token is None:
        return None
    return max_tokens * chars_per_token


def default_request_bytes(max_tokens: Optional[int], chars_per_token: Optional[int]) -> int:
    """The default body cap: a maximal prompt written as JSON in the most bytes it can take, plus the
    rest of the body; never more than the former fixed default (4 MiB)."""
    chars = prompt_char_limit(max_tokens, chars_per_token)
    if chars is None:
        return DEFAULT_REQUEST_BYTES
    return min(DEFAULT_REQUEST_BYTES, chars * JSON_BYTES_PER_CHAR + REST_OF_BODY_BYTES)
