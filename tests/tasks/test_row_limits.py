"""Issue 15 item 3: labels that cannot be graded and rows too long for the run are skipped and counted;
nothing is truncated silently, and one long row never sets the length of an SFT batch."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from slime_ext.config import load_config
from slime_ext.tasks.dataset import DatasetError, DatasetNotFound, LoadReport, load_jsonl
from slime_ext.tasks.lengths import LengthLimits, PromptTooLong, drop_too_long, prompt_token_ids
from tests.conftest import CONFIGS

LONG_PROMPT = "What is 1 + 1? " * 700  # 10,500 characters: the row of the issue


class CharTokenizer:
    """One token per character; EOS is 0 (lengths are then plain character counts)."""

    eos_token_id = 0

    def __call__(self, text: str) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def write_rows(path, rows: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


# -- labels --------------------------------------------------------------------------------------------------
def test_empty_and_non_finite_labels_are_malformed(tmp_path):
    path = tmp_path / "labels.jsonl"
    write_rows(path, [{"prompt": "a", "label": "3"}, {"prompt": "b", "label": ""}, {"prompt": "c", "label": "  "},
                      '{"prompt": "d", "label": NaN}', '{"prompt": "e", "label": Infinity}',
                      '{"prompt": "f", "label": -Infinity}', {"prompt": "g", "label": 0}])
    rows, report = load_jsonl(path)
    assert [r["prompt"] for r in rows] == ["a", "g"] and [r["label"] for r in rows] == ["3", "0"]
    assert report.skipped_by_reason == {"empty_label": 2, "non_finite_label": 3}
    assert report.examples[2] == f"{path}:4: non_finite_label: 'label' is nan"


def test_a_file_of_only_bad_labels_is_a_dataset_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    write_rows(path, ['{"prompt": "d", "label": NaN}', {"prompt": "b", "label": ""}, '{"prompt": "x", "label": NaN}'])
    with pytest.raises(DatasetError, match="no valid rows; 3 skipped, most common reason 'non_finite_label' \\(2x\\)"):
        load_jsonl(path)


def test_a_missing_file_is_a_dataset_error_and_a_file_not_found_error(tmp_path):
    with pytest.raises(DatasetNotFound) as info:
        load_jsonl(tmp_path / "nope.jsonl")
    assert isinstance(info.value, DatasetError) and isinstance(info.value, FileNotFoundError)


# -- too-long rows -------------------------------------------------------------------------------------------
def loaded(tmp_path, rows: list) -> tuple[list[dict], LoadReport]:
    path = tmp_path / "train.jsonl"
    write_rows(path, rows)
    return load_jsonl(path)


def test_a_prompt_longer_than_max_prompt_len_is_skipped_and_counted(tmp_path, caplog):
    good = [{"prompt": f"What is {i} + 1?", "label": i + 1} for i in range(6)]
    rows, report = loaded(tmp_path, good[:3] + [{"prompt": LONG_PROMPT, "label": 2}] + good[3:])
    kept = drop_too_long(rows, CharTokenizer(), "plain", LengthLimits(max_prompt_len=256), report)
    assert [r["prompt"] for r in kept] == [g["prompt"] for g in good]
    assert report.n_rows_ok == 6 and report.n_skipped == 1
    assert report.skipped_by_reason == {"prompt_too_long": 1}
    # the templated prompt: "Question: " + 10,500 characters + "\nAnswer:\n"
    assert report.examples == [f"{report.path}:4: prompt_too_long: 10519 prompt tokens > rollout.max_prompt_len 256"]
    (warning,) = [r.getMessage() for r in caplog.records if "too long" in r.getMessage()]
    assert "skipped 1 of 7 rows as too long" in warning and ":4: prompt_too_long" in warning


def test_sft_rows_must_fit_the_context_with_their_solution(tmp_path):
    rows = [{"prompt": "short", "label": "1", "solution": "x" * 1000},  # 24 + 1000 + EOS = 1025 > 1024
            {"prompt": "short", "label": "1", "solution": "x" * 999},   # exactly 1024: kept
            {"prompt": "p" * 300, "label": "1"}]                         # 319 prompt tokens > 256
    rows, report = loaded(tmp_path, rows)
    kept = drop_too_long(rows, CharTokenizer(), "plain", LengthLimits(256, context=1024), report)
    assert [len(r["solution"]) for r in kept] == [999]
    assert report.skipped_by_reason == {"prompt_plus_solution_too_long": 1, "prompt_too_long": 1}
    # RL rows are held to the prompt limit only: the long solution stays
    rl_rows, rl_report = loaded(tmp_path, rows)
    assert len(drop_too_long(rl_rows, CharTokenizer(), "plain", LengthLimits(256), rl_report)) == 2


def test_no_row_fitting_is_a_dataset_error(tmp_path):
    rows, report = loaded(tmp_path, [{"prompt": LONG_PROMPT, "label": 1}, {"prompt": LONG_PROMPT + "?", "label": 2}])
    with pytest.raises(DatasetError, match="no row fits the run's limits; .*0 rows ok, 2 skipped \\(prompt_too_long=2\\)"):
        drop_too_long(rows, CharTokenizer(), "plain", LengthLimits(256), report)


def test_limits_come_from_the_config(tmp_path):
    cfg = load_config(CONFIGS / "grpo.yaml", ["rollout.max_prompt_len=200"]).config
    assert LengthLimits.from_config(cfg) == LengthLimits(200, None)
    assert LengthLimits.from_config(cfg, sft=True) == LengthLimits(200, 1024)  # tiny-qwen3-moe's context


# -- the SFT batch and the rollout prompt --------------------------------------------------------------------
def test_one_long_row_does_not_set_the_sft_batch_length(tmp_path):
    from slime_ext.orchestration.training_job import TrainingJob, sft_samples

    cfg = load_config(CONFIGS / "grpo.yaml").config  # max_prompt_len 256 + max_response_len 160
    good = [{"prompt": f"What is {i} + {i}?", "label": 2 * i, "solution": f"{i} + {i} = {2 * i}"} for i in range(8)]
    rows, _ = loaded(tmp_path, good[:5] + [{"prompt": LONG_PROMPT, "label": 2, "solution": "2"}] + good[5:])
    job = SimpleNamespace(method=SimpleNamespace(warm_start_rows=lambda rows, seed: rows), train_rows=rows,
                          sft_seed=0, cfg=cfg, tokenizer=CharTokenizer())
    sft_rows = TrainingJob.sft_rows(job)
    assert len(sft_rows) == 8 and job.sft_report.skipped_by_reason == {"prompt_too_long": 1}
    batch = sft_samples(sft_rows, CharTokenizer(), "plain", 256 + 160, "sft0-")
    # "Question: What is 7 + 7?\nAnswer:\n" (33) + "7 + 7 = 14" (10) + EOS: the longest good row, not 10,519
    assert max(len(s.prompt_ids) + len(s.response_ids) for s in batch) == 44
    with pytest.raises(PromptTooLong, match="a prompt of 10519 tokens leaves no room"):
        sft_samples(rows, CharTokenizer(), "plain", 256 + 160, "sft0-")


def test_rollouts_refuse_a_too_long_prompt_instead_of_cutting_it():
    from slime_ext.orchestration.rollout_manager import RolloutManager
    from slime_ext.tasks.templates import get_template

    cfg = load_config(CONFIGS / "grpo.yaml").config
    manager = SimpleNamespace(tokenizer=CharTokenizer(), template=get_template("plain"), config=cfg)
    fits = "q" * (256 - 19)  # 19 characters of template
    assert RolloutManager.prompt_ids(manager, fits) == prompt_token_ids(CharTokenizer(), "plain", fits)
    assert len(RolloutManager.prompt_ids(manager, fits)) == 256
    with pytest.raises(PromptTooLong, match="a prompt of 257 tokens exceeds rollout.max_prompt_len=256"):
        RolloutManager.prompt_ids(manager, fits + "q")
