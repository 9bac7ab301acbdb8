"""Rows too long for the run, skipped and counted like malformed rows.

Why: one ~10 KB prompt padded a whole SFT batch to its length and took the machine to 22.7 of 23.5 GB,
and rollouts used to cut such prompts from the left without a word (the model then answered a question
it never saw whole). A row's length is only known once the tokenizer exists, so this runs after the
tokenizer stage, on the same `LoadReport` the loader fills: one count per reason, a few row numbers.

Rules (docs/configs.md, "Rows that are skipped"):
- RL, evaluation and SFT rows: the templated prompt must fit `rollout.max_prompt_len` tokens.
- SFT rows: prompt + reference solution + EOS must also fit the model's context, the solution counted as the
  SFT batch holds it (`response_tokens.sft_response`: a tool-call solution piece by piece).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from slime_ext.tasks.dataset import DatasetError, LoadReport
from slime_ext.tasks.response_tokens import sft_response
from slime_ext.tasks.templates import get_template

__all__ = ["PROMPT_TOO_LONG", "SFT_TOO_LONG", "LengthLimits", "PromptTooLong", "prompt_token_ids",
           "sft_token_ids", "drop_too_long"]

log = logging.getLogger(__name__)

PROMPT_TOO_LONG = "prompt_too_long"
SFT_TOO_LONG = "prompt_plus_solution_too_long"


class PromptTooLong(ValueError):
    """A prompt longer than `rollout.max_prompt_len` reached a place that cannot skip it (it must have
    been filtered when the data was prepared; nothing is truncated silently)."""


@dataclass(frozen=True)
class LengthLimits:
    """Token limits of one run: the prompt alone, and (SFT) prompt + solution + EOS (None: no SFT check)."""

    max_prompt_len: int
    context: Optional[int] = None

    @classmethod
    def from_config(cls, config: Any, sft: bool = False) -> "LengthLimits":
        """`rollout.max_prompt_len`, and for SFT rows the model's context (`ModelConfig.context_length`)."""
        context = config.model.context_length()[0] if sft else None
        return cls(config.rollout.max_prompt_len, context)


def prompt_token_ids(tokenizer: Any, template: str, prompt: str) -> list[int]:
    """The templated prompt's token ids, exactly as rollouts, evaluation and SFT feed them to the model."""
    return list(tokenizer(get_template(template).format(prompt))["input_ids"])


def sft_token_ids(tokenizer: Any, row: dict) -> list[int]:
    """The response part of an SFT row, exactly as the SFT batch holds it (`response_tokens.sft_response`: a
    solution that calls tools tokenised piece by piece, then EOS)."""
    return sft_response(tokenizer, row)[0]


def _too_long(row: dict, tokenizer: Any, template: str, limits: LengthLimits) -> Optional[tuple[str, str]]:
    """(reason, detail) when the row does not fit, else None."""
    n_prompt = len(prompt_token_ids(tokenizer, template, row["prompt"]))
    if n_prompt > limits.max_prompt_len:
        return PROMPT_TOO_LONG, f"{n_prompt} prompt tokens > rollout.max_prompt_len {limits.max_prompt_len}"
    if limits.context is not None:
        n_total = n_prompt + len(sft_token_ids(tokenizer, row))
        if n_total > limits.context:
            return SFT_TOO_LONG, f"{n_total} prompt + solution tokens > the model's context {limits.context}"
    return None


def drop_too_long(rows: list[dict], tokenizer: Any, template: str, limits: LengthLimits,
                  report: LoadReport) -> list[dict]:
    """The rows that fit `limits`; the others are recorded in `report` (by reason, with their line numbers)
    and logged once. `report` counts `rows` among its ok rows (the loader's report of the file they came
    from); skipped ones move from ok to skipped. No row fitting at all is a DatasetError."""
    kept = []
    before = report.n_skipped
    for i, row in enumerate(rows):
        found = _too_long(row, tokenizer, template, limits)
        if found is None:
            kept.append(row)
            continue
        report.record_skip(int(row.get("source_line", i + 1)), *found)
        report.n_rows_ok -= 1
    dropped = report.n_skipped - before
    if rows and not kept:
        raise DatasetError(f"{report.path}: no row fits the run's limits; {report.summary()}")
    if dropped:
        log.warning("%s: skipped %d of %d rows as too long; %s", report.path, dropped, len(rows), report.summary())
    return kept
