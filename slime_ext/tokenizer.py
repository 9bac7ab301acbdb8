"""Locally trained byte-level BPE tokenizer, and one loader for any HF tokenizer dir.

Why train one: the CPU end-to-end path uses a ~3M-param model, which cannot
afford Qwen3's 151k-row embedding. A few hundred tokens trained on the task text
suffice, provided numbers are split one digit per token (measured: that is what
lets the tiny model learn multi-digit arithmetic). Pre-tokenisation copies
Qwen2/Qwen3 (regex split with single-digit pieces, then byte-level mapping), so
the same code paths (word-initial ``Ġ`` marker, special tokens, chat markup)
work unchanged against a real Qwen3 tokenizer directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # transformers is heavy; import it only when a function needs it
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "SPECIAL_TOKENS",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "QWEN2_SPLIT_PATTERN",
    "train_tokenizer",
    "load_tokenizer",
    "word_initial_marker",
    "build_embedded_tokenizer",
]

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = EOS_TOKEN
# Order fixes their ids (0..6), so it is part of the on-disk format.
SPECIAL_TOKENS: tuple[str, ...] = (
    EOS_TOKEN,
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<speak>",
    "</speak>",
)
# Qwen2's pre-tokenizer regex: contractions, letter runs (with one leading
# non-letter such as a space), single digits, punctuation runs, newlines, spaces.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BYTE_LEVEL_MARKER = "Ġ"
SENTENCEPIECE_MARKER = "▁"
DEFAULT_MODEL_MAX_LENGTH = 4096
# Bump when anything that changes the trained files changes, to invalidate caches.
_FORMAT_VERSION = "bbpe-qwen2split-v1"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt")


def _build_backend(vocab_size: int):
    """An untrained `tokenizers.Tokenizer` with Qwen2-style pipeline, plus its trainer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is in the vocab, so any text round-trips without <unk>.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 320,
    out_dir: str | os.PathLike[str] | None = None,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> "PreTrainedTokenizerFast":
    """Train a byte-level BPE on ``texts``; save to ``out_dir`` (if given) as an HF dir.

    Deterministic: the same texts and vocab_size give byte-identical files.
    The vocab may end below ``vocab_size`` when the corpus has no more pairs
    seen at least twice.
    """
    from transformers import PreTrainedTokenizerFast

    n_base = len(SPECIAL_TOKENS) + 256
    if vocab_size < n_base:
        raise ValueError(f"vocab_size must be >= {n_base} (specials + 256 bytes), got {vocab_size}")
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("train_tokenizer needs at least one non-empty text")
    backend, trainer = _build_backend(vocab_size)
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t != EOS_TOKEN],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        hf.save_pretrained(str(out_dir))
    return hf


def checkpoint_with_vocabulary(path: str, tokenizer: Any, key: str) -> Path:
    """The HF checkpoint `key` names, refused unless its tokenizer's vocabulary is `tokenizer`'s exactly: a partner
    or a teacher reads the policy's token ids as they are (no re-tokenising)."""
    from sglang_patches.tandem import check_same_vocabulary

    checkpoint = Path(path)
    if not (checkpoint / "config.json").exists():
        raise FileNotFoundError(f"{key}={path}: no HF checkpoint there (config.json missing)")
    check_same_vocabulary(tokenizer.get_vocab(), load_tokenizer(str(checkpoint)).get_vocab())
    return checkpoint


def load_tokenizer(path: str | os.PathLike[str]) -> "PreTrainedTokenizerBase":
    """Load a local HF tokenizer directory (ours or e.g. Qwen3's) via AutoTokenizer.

    Local files only: a missing path is a FileNotFoundError and a directory with
    no tokenizer files a ValueError, both naming the path, instead of a hub lookup.
    """
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path does not exist: {p}")
    if not p.is_dir():
        raise ValueError(f"tokenizer path is not a directory: {p}")
    if not any((p / name).is_file() for name in _TOKENIZER_FILES):
        raise ValueError(f"not a tokenizer directory (none of {', '.join(_TOKENIZER_FILES)}): {p}")
    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"could not load tokenizer from {p}: {e}") from e


def word_initial_marker(tokenizer: "PreTrainedTokenizerBase") -> str:
    """"Ġ" for byte-level BPE vocabularies, "▁" for SentencePiece-style ones.

    Detected from the vocab (whichever marker prefixes more tokens), since
    tokenizer classes do not state it and code that builds word-level logit
    masks or reward features needs to know where words start.
    """
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    counts = Counter(
        tok[0]
        for tok in tokenizer.get_vocab()
        if tok and tok not in special and tok[0] in (BYTE_LEVEL_MARKER, SENTENCEPIECE_MARKER)
    )
    if not counts:
        raise ValueError(
            f"no word-initial marker ({BYTE_LEVEL_MARKER!r} or {SENTENCEPIECE_MARKER!r}) found in the "
            f"vocabulary of {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}"
        )
    # On a tie max() keeps the first candidate, i.e. byte-level.
    return max((BYTE_LEVEL_MARKER, SENTENCEPIECE_MARKER), key=lambda m: counts.get(m, 0))


def _content_hash(texts: list[str], vocab_size: int) -> str:
    h = hashlib.sha256()
    h.update(f"{_FORMAT_VERSION}\n{vocab_size}\n".encode())
    for t in texts:
        b = t.encode("utf-8", errors="surrogatepass")
        h.update(len(b).to_bytes(8, "little"))  # length prefix: ["ab","c"] != ["a","bc"]
        h.update(b)
    return h.hexdigest()


def build_embedded_tokenizer(
    cache_dir: str | os.PathLike[str], texts: Iterable[str], vocab_size: int = 320
) -> Path:
    """Train (once) and cache a tokenizer keyed by sha256 of (vocab_size, texts).

    A repeat call with the same inputs returns the cached directory without
    training. The build happens in a temp dir inside cache_dir and is renamed
    into place, so a crash or a concurrent builder never leaves a half-written
    directory under the final name.
    """
    texts = list(texts)
    cache = Path(cache_dir)
    final = cache / f"tok-{vocab_size}-{_content_hash(texts, vocab_size)[:20]}"
    if (final / "tokenizer.json").is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".{final.name}.tmp-"))
    try:
        train_tokenizer(texts, vocab_size=vocab_size, out_dir=tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process finished first (final exists and is non-empty): use theirs.
            if not (final / "tokenizer.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
