"""Locally trained byte-level BPE: per-digit numbers, Ġ word marker, exact round trips,
special tokens, HF save/load, determinism, marker detection, and the build cache."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from slime_ext import tokenizer as tk
from slime_ext.tasks.synthetic_math import LEVELS, generate_dataset
from slime_ext.tokenizer import (
    SPECIAL_TOKENS,
    build_embedded_tokenizer,
    load_tokenizer,
    train_tokenizer,
    word_initial_marker,
)

UNICODE_TEXTS = [
    "Héllo wörld — naïve café",
    "emoji 🌍🚀👩‍👩‍👧 and ZWJ",
    "中文字符 日本語 한국어",
    "tabs\tand\n\nnewlines\r\n and  double  spaces ",
    "punct . , ; 's don't ?! (x) [y] {z} \\boxed{12}",
    "\x00\x01 control bytes \u200b zero width",
    "   leading and trailing   ",
    "1234567890 3.14159 -42 1e10",
]


def corpus(n: int, seed: int) -> list[str]:
    rows = generate_dataset(list(LEVELS), n, seed=seed, split="train")
    return [r["prompt"] + "\n" + r["solution"] for r in rows]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus(2000, 0)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, texts) -> Path:
    out = tmp_path_factory.mktemp("tok")
    train_tokenizer(texts, vocab_size=320, out_dir=out)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def non_special_vocab(tok) -> list[str]:
    return [t for t in tok.get_vocab() if t not in SPECIAL_TOKENS]


def test_vocab_has_all_bytes_and_specials(tok) -> None:
    vocab = tok.get_vocab()
    assert len(vocab) == 320
    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(vocab)
    assert [vocab[s] for s in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))


def test_digits_are_single_tokens(tok) -> None:
    for d in "0123456789":
        assert tok.encode(d, add_special_tokens=False) == [tok.convert_tokens_to_ids(d)]
    for t in non_special_vocab(tok):
        if any(c.isdigit() for c in t):
            assert len(t) == 1, f"token {t!r} merges a digit with something"
    assert tok.convert_ids_to_tokens(tok.encode("so 123 + 45 = 168.", add_special_tokens=False)).count("1") == 2
    pieces = tok.convert_ids_to_tokens(tok.encode(" 4096", add_special_tokens=False))
    assert pieces == ["Ġ", "4", "0", "9", "6"]


def test_pre_tokenizer_isolates_every_digit(tok) -> None:
    # The pipeline itself splits numbers per digit, whatever the merge budget.
    pieces = [p for p, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("Mia has 2024 apples.")]
    assert pieces == ["Mia", "Ġhas", "Ġ", "2", "0", "2", "4", "Ġapples", "."]


def test_digit_heavy_corpus_still_never_merges_digits(tmp_path) -> None:
    # With a large budget and numbers far more frequent than anything else, BPE
    # would merge "12" etc. if the pre-tokenizer allowed it.
    numbers = [" ".join(str(n) for n in range(i, i + 40)) for i in range(0, 4000, 40)]
    t = train_tokenizer(numbers * 3 + ["so 12 + 34 = 46."] * 50, vocab_size=600)
    multi = [x for x in non_special_vocab(t) if any(c.isdigit() for c in x) and len(x) > 1]
    assert multi == []
    assert len(t) < 600  # nothing left to merge: only spaces and single digits exist


def test_words_carry_word_initial_marker(tok) -> None:
    for word in ["apples", "marbles", "friend", "many", "times"]:
        pieces = tok.convert_ids_to_tokens(tok.encode(" " + word, add_special_tokens=False))
        assert pieces[0].startswith("Ġ") and len(pieces[0]) > 1, pieces
        assert not any("Ġ" in p for p in pieces[1:]), pieces
        assert "".join(pieces) == "Ġ" + word
    # Frequent words became single tokens.
    assert tok.convert_ids_to_tokens(tok.encode(" friend", add_special_tokens=False)) == ["Ġfriend"]


def test_round_trip_task_text(tok) -> None:
    held_out = corpus(200, 99)
    for t in held_out:
        ids = tok.encode(t, add_special_tokens=False)
        assert tok.decode(ids) == t


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_round_trip_arbitrary_unicode(tok, text) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.unk_token_id is None or tok.unk_token_id not in ids


def test_special_tokens(tok) -> None:
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id == tok.pad_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    for s in SPECIAL_TOKENS:
        sid = tok.convert_tokens_to_ids(s)
        assert tok.encode(s, add_special_tokens=False) == [sid]
        ids = tok.encode(f"x{s}y", add_special_tokens=False)
        assert sid in ids and len(ids) == 3
    chat = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think></think>"
    assert tok.decode(tok.encode(chat, add_special_tokens=False)) == chat
    assert tok.model_max_length == tk.DEFAULT_MODEL_MAX_LENGTH


def test_save_load_identical_ids(tmp_path, texts) -> None:
    mem = train_tokenizer(texts[:500], vocab_size=300, out_dir=tmp_path)
    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    ours = load_tokenizer(tmp_path)
    sample = corpus(50, 5) + UNICODE_TEXTS
    for t in sample:
        ids = mem.encode(t)
        assert auto.encode(t) == ids == ours.encode(t)
    assert auto.eos_token == auto.pad_token == "<|endoftext|>"
    assert len(auto) == len(mem) == 300


def test_training_is_deterministic(tmp_path, texts, tok_dir) -> None:
    train_tokenizer(texts, vocab_size=320, out_dir=tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_bytes() == (tok_dir / name).read_bytes()


def test_different_corpus_gives_different_vocab(tmp_path, tok_dir) -> None:
    train_tokenizer(["zebra quokka " * 5, "quokka zebra"] * 50, vocab_size=300, out_dir=tmp_path)
    assert (tmp_path / "tokenizer.json").read_bytes() != (tok_dir / "tokenizer.json").read_bytes()


def test_word_initial_marker_byte_level(tok) -> None:
    assert word_initial_marker(tok) == "Ġ"


def _wordlevel_tokenizer(tokens: list[str]) -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def test_word_initial_marker_sentencepiece_style() -> None:
    sp = _wordlevel_tokenizer(["<unk>", "▁the", "▁cat", "▁sat", "s", "at", "Ġodd"])
    assert word_initial_marker(sp) == "▁"


def test_word_initial_marker_absent_raises() -> None:
    with pytest.raises(ValueError, match="marker"):
        word_initial_marker(_wordlevel_tokenizer(["<unk>", "the", "cat"]))


def test_load_tokenizer_errors(tmp_path) -> None:
    missing = tmp_path / "missing_tok"
    with pytest.raises(FileNotFoundError, match="missing_tok"):
        load_tokenizer(missing)
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty_dir"):
        load_tokenizer(empty)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="file.txt"):
        load_tokenizer(a_file)


def test_train_tokenizer_rejects_bad_input(tmp_path) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)
    with pytest.raises(ValueError, match="non-empty"):
        train_tokenizer(["", ""], vocab_size=300)


def test_build_embedded_tokenizer_caches(tmp_path, monkeypatch) -> None:
    texts = corpus(300, 7)
    first = build_embedded_tokenizer(tmp_path, texts, 300)
    assert (first / "tokenizer.json").is_file()
    mtime = (first / "tokenizer.json").stat().st_mtime_ns

    def boom(*a, **k):
        raise AssertionError("retrained although cached")

    monkeypatch.setattr(tk, "train_tokenizer", boom)
    second = build_embedded_tokenizer(tmp_path, iter(texts), 300)  # any iterable
    assert second == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == mtime
    # Different inputs are a different cache entry (and do need training).
    with pytest.raises(AssertionError, match="retrained"):
        build_embedded_tokenizer(tmp_path, texts, 301)
    with pytest.raises(AssertionError, match="retrained"):
        build_embedded_tokenizer(tmp_path, texts[:-1], 300)
    # Failed builds leave no temp directories behind; only the one finished entry exists.
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
    assert word_initial_marker(load_tokenizer(first)) == "Ġ"


def test_tokens_per_level_increase(tok) -> None:
    means = []
    for name in LEVELS:
        rows = generate_dataset(name, 200, seed=3, split="train")
        means.append(statistics.mean(len(tok.encode(r["solution"], add_special_tokens=False)) for r in rows))
    assert all(a < b for a, b in zip(means, means[1:])), means
