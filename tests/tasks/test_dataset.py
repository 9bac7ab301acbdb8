"""JSONL loader: every kind of bad row is skipped and counted exactly; fatal cases raise clearly.
Also the prompt-template registry."""

from __future__ import annotations

import json
import logging

import pytest

from slime_ext.tasks.dataset import DatasetError, iter_jsonl, load_jsonl, LoadReport
from slime_ext.tasks.templates import DEFAULT_TEMPLATE, get_template

# (raw bytes of one line without its ending, expected outcome)
MIXED_LINES: list[tuple[bytes, str]] = [
    (b'\xef\xbb\xbf{"prompt": "p1", "label": "1", "id": "a"}', "ok"),  # 1 BOM at file start
    (b'{"prompt": "p2", "label": 2}', "ok"),  # 2 numeric label
    (b'{"prompt": "p3", "label": 2.5, "label_f": 1}', "ok"),  # 3 float label
    (b"", "blank"),  # 4
    (b'{"prompt": "p5", "label": ', "invalid_json"),  # 5 truncated
    (b"[1, 2]", "not_an_object"),  # 6
    (b'{"label": "x"}', "missing_key"),  # 7 no prompt
    (b'{"prompt": "", "label": "1"}', "empty_prompt"),  # 8
    (b'{"prompt": "   ", "label": "1"}', "empty_prompt"),  # 9 whitespace only
    (b'{"prompt": 5, "label": "1"}', "wrong_type"),  # 10 prompt not a string
    (b'{"prompt": "p11", "label": [1]}', "wrong_type"),  # 11 label a list
    (b'{"prompt": "caf\xe9", "label": "1"}', "bad_encoding"),  # 12 latin-1 byte
    (b"   \t", "blank"),  # 13
    (b'{"prompt": "p14", "label": true}', "wrong_type"),  # 14 bool is not a number
    (b'{"prompt": "p15"}', "missing_key"),  # 15 no label
    ('{"prompt": "p16 caf\u00e9 \u2603", "label": "7", "extra": {"a": 1}}'.encode(), "ok"),  # 16
]


def write_mixed(tmp_path, ending: bytes = b"\r\n"):
    path = tmp_path / "mixed.jsonl"
    # The last line has no line ending at all.
    path.write_bytes(ending.join(raw for raw, _ in MIXED_LINES))
    return path


@pytest.mark.parametrize("ending", [b"\r\n", b"\n"])
def test_mixed_file_exact_counts(tmp_path, ending) -> None:
    path = write_mixed(tmp_path, ending)
    rows, report = load_jsonl(path)
    assert report.n_rows_ok == 4
    assert report.n_skipped == 10
    assert report.skipped_by_reason == {
        "invalid_json": 1,
        "not_an_object": 1,
        "missing_key": 2,
        "empty_prompt": 2,
        "wrong_type": 3,
        "bad_encoding": 1,
    }
    assert [r["source_line"] for r in rows] == [1, 2, 3, 16]
    assert [r["prompt"] for r in rows] == ["p1", "p2", "p3", "p16 caf\u00e9 \u2603"]
    assert [r["label"] for r in rows] == ["1", "2", "2.5", "7"]
    # Examples: the first five skipped rows, each naming file and line.
    assert len(report.examples) == 5
    for ex, line_no in zip(report.examples, [5, 6, 7, 8, 9]):
        assert ex.startswith(f"{path}:{line_no}: ")
    assert "invalid_json" in report.examples[0] and "not_an_object" in report.examples[1]
    assert "'prompt'" in report.examples[2]
    summary = report.summary()
    assert "4 rows ok" in summary and "10 skipped" in summary and "wrong_type=3" in summary


def test_row_normalisation(tmp_path) -> None:
    path = write_mixed(tmp_path)
    rows, _ = load_jsonl(path)
    first, second, third, last = rows
    assert first == {"prompt": "p1", "label": "1", "row_id": "a", "source_line": 1, "id": "a"}
    assert second["row_id"] == f"{path}:2"
    assert third["label_f"] == 1  # other fields carried through
    assert last["extra"] == {"a": 1}
    assert "\r" not in json.dumps(rows)


def test_warning_logged_with_summary(tmp_path, caplog) -> None:
    path = write_mixed(tmp_path)
    with caplog.at_level(logging.WARNING, logger="slime_ext.tasks.dataset"):
        load_jsonl(path)
    assert any("10 skipped" in rec.getMessage() and str(path) in rec.getMessage() for rec in caplog.records)


def test_clean_file_logs_no_warning(tmp_path, caplog) -> None:
    path = tmp_path / "clean.jsonl"
    path.write_text('{"prompt": "a", "label": "1"}\n{"prompt": "b", "label": "2"}\n')
    with caplog.at_level(logging.WARNING, logger="slime_ext.tasks.dataset"):
        rows, report = load_jsonl(path)
    assert len(rows) == 2 and report.n_skipped == 0 and report.summary() == f"{path}: 2 rows ok, 0 skipped"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_nested_dotted_keys(tmp_path) -> None:
    path = tmp_path / "nested.jsonl"
    lines = [
        {"meta": {"question": "What is 2+2?"}, "answer": {"value": 4}, "id": 17},
        {"meta": {"question": "Q2"}, "answer": {"value": "x"}},
        {"meta": {"other": "no question"}, "answer": {"value": 1}},
        {"meta": "not an object", "answer": {"value": 1}},
        {"meta.question": "flat dotted key", "answer": {"value": 5}},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    rows, report = load_jsonl(path, prompt_key="meta.question", label_key="answer.value")
    assert [r["prompt"] for r in rows] == ["What is 2+2?", "Q2", "flat dotted key"]
    assert [r["label"] for r in rows] == ["4", "x", "5"]
    assert rows[0]["row_id"] == "17"
    assert rows[0]["meta"] == {"question": "What is 2+2?"}
    assert report.skipped_by_reason == {"missing_key": 2}


def test_custom_keys_and_required_keys(tmp_path) -> None:
    path = tmp_path / "custom.jsonl"
    lines = [
        {"question": "Q1", "answer": "A1", "prompt": "ignored original", "source": "s"},
        {"question": "Q2", "answer": "A2"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    rows, report = load_jsonl(path, prompt_key="question", label_key="answer")
    assert [(r["prompt"], r["label"]) for r in rows] == [("Q1", "A1"), ("Q2", "A2")]
    assert "question" not in rows[0] and "answer" not in rows[0]
    rows, report = load_jsonl(path, prompt_key="question", label_key="answer", required_keys=("source",))
    assert len(rows) == 1 and report.skipped_by_reason == {"missing_key": 1}
    assert "'source'" in report.examples[0] and f"{path}:2:" in report.examples[0]


def test_zero_valid_rows_names_file_and_reason(tmp_path) -> None:
    path = tmp_path / "allbad.jsonl"
    path.write_text('{"prompt": "x"}\n{"prompt": "y"}\n[1]\n')
    with pytest.raises(DatasetError) as ei:
        load_jsonl(path)
    msg = str(ei.value)
    assert str(path) in msg and "missing_key" in msg and f"{path}:1:" in msg
    assert isinstance(ei.value, ValueError)


def test_empty_file_raises(tmp_path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n  \n")
    with pytest.raises(DatasetError, match="no rows"):
        load_jsonl(path)


def test_missing_file_raises(tmp_path) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_jsonl(path)


def test_max_bad_fraction(tmp_path) -> None:
    path = write_mixed(tmp_path)  # 4 ok, 10 bad: 71.4% bad
    with pytest.raises(DatasetError) as ei:
        load_jsonl(path, max_bad_fraction=0.7)
    assert str(path) in str(ei.value) and "10/14" in str(ei.value)
    rows, report = load_jsonl(path, max_bad_fraction=0.72)
    assert len(rows) == 4 and report.bad_fraction == pytest.approx(10 / 14)
    with pytest.raises(ValueError):
        load_jsonl(path, max_bad_fraction=1.5)


def test_iter_jsonl_streams(tmp_path) -> None:
    # The first row is produced before the rest of the file is examined.
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for i in range(1000):
            f.write(json.dumps({"prompt": f"q{i}", "label": i}) + "\n")
    report = LoadReport(path=str(path))
    it = iter_jsonl(path, report)
    assert next(it)["prompt"] == "q0"
    assert report.n_rows_ok == 1
    assert sum(1 for _ in it) == 999 and report.n_rows_ok == 1000


def test_templates() -> None:
    assert DEFAULT_TEMPLATE == "plain"
    assert get_template("plain").format("What is 1+1?") == "Question: What is 1+1?\nAnswer:\n"
    assert (
        get_template("qwen_chat").format("Hi {there}")
        == "<|im_start|>user\nHi {there}<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError) as ei:
        get_template("nope")
    assert "plain" in str(ei.value) and "qwen_chat" in str(ei.value)
