"""Token lengths per level with the tokenizer a run trains: how long the references of each level are.

Why: the levels are sized in tokens (the hard ones should need 200-400 response tokens), and what counts is
the run's own tokenizer, a byte-level BPE trained on that run's data (per-digit numbers, so lengths grow with
the digits). This builds it as the pipeline's tokenizer stage does (`tokenizer.path: embedded`: the first
`tokenizer.n_training_texts` prepared train rows, prompt + "\\n" + solution, `tokenizer.vocab_size`) and
reports, per level of the eval rows, the response length (solution + EOS, what `rollout.max_response_len`
must hold) and the templated prompt's length. A method's row transform (SxS's formats, Tandem's paragraphs) is
passed in, as to `prepare_data` (the data layer knows no method): the CLI that looks it up from a config is
`python -m slime_ext.tools.reference_lengths`.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Optional, Sequence

from slime_ext.tasks.lengths import prompt_token_ids, sft_token_ids
from slime_ext.tasks.prepare import RowTransform, prepare_data, rewrite_synthetic_rows
from slime_ext.tasks.synthetic_math import generate_dataset

__all__ = ["level_lengths", "measured_rows", "pipeline_tokenizer", "format_table"]


def level_lengths(rows: Sequence[dict], tokenizer: Any, template: str) -> dict[str, dict[str, float]]:
    """Per level (in order of first appearance): rows, response tokens (solution + EOS) mean/min/max, prompt
    tokens mean/max, and the share of rows with a re-check tail."""
    by_level: dict[str, list[dict]] = {}
    for row in rows:
        by_level.setdefault(str(row.get("level")), []).append(row)
    out = {}
    for level, group in by_level.items():
        response = [len(sft_token_ids(tokenizer, r)) for r in group]
        prompt = [len(prompt_token_ids(tokenizer, template, r["prompt"])) for r in group]
        out[level] = {"rows": len(group), "response_mean": round(statistics.mean(response), 1),
                      "response_min": min(response), "response_max": max(response),
                      "prompt_mean": round(statistics.mean(prompt), 1), "prompt_max": max(prompt),
                      "recheck_share": round(sum(bool(r.get("recheck")) for r in group) / len(group), 3)}
    return out


def measured_rows(config: Any, per_level: int, row_transform: Optional[RowTransform] = None) -> list[dict]:
    """`per_level` eval rows of each eval level, rewritten as the run's data stage rewrites them
    (`rewrite_synthetic_rows`: the method's `row_transform`, else `solution_tool`, else `step_separator`)."""
    syn = config.data.synthetic
    rows = [r for level in syn.eval_levels
            for r in generate_dataset(level, per_level, syn.seed, "eval", recheck_share=syn.recheck_share_value())]
    return rewrite_synthetic_rows(rows, syn, row_transform)


def pipeline_tokenizer(config: Any, cache_dir: str | Path, row_transform: Optional[RowTransform] = None) -> Any:
    """The run's embedded tokenizer, built (cached) from its prepared train rows (`row_transform` applied) as the
    driver's tokenizer stage does; a configured `tokenizer.path` is loaded instead."""
    from slime_ext.tokenizer import build_embedded_tokenizer, load_tokenizer

    tok = config.tokenizer
    if tok.path != "embedded":
        return load_tokenizer(tok.path)
    data = prepare_data(config.data, cache_dir, row_transform)
    texts = [r["prompt"] + "\n" + str(r.get("solution", r["label"])) for r in data.train[: tok.n_training_texts]]
    return load_tokenizer(build_embedded_tokenizer(Path(cache_dir) / "tokenizers", texts, tok.vocab_size))


def format_table(stats: dict[str, dict[str, float]]) -> str:
    """A markdown table of `level_lengths`."""
    head = ("| level | rows | response tokens mean | min | max | prompt tokens mean | max | re-check share |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [f"| {lvl} | {s['rows']} | {s['response_mean']} | {s['response_min']} | {s['response_max']} | "
             f"{s['prompt_mean']} | {s['prompt_max']} | {s['recheck_share']} |" for lvl, s in stats.items()]
    return "\n".join([head, *lines])
