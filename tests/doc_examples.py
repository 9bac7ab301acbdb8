"""Worked examples read from the docs and the tiny job every end-to-end doc test runs them with."""

from __future__ import annotations

import re
from pathlib import Path


def fenced_blocks(text: str, entry_marker: str) -> dict[str, str]:
    """The fenced code blocks of `text`, keyed by the file named (in backticks) on the line before each; the
    block containing `entry_marker` (a registry line, e.g. "MethodEntry(") is keyed 'registry'."""
    out = {}
    for match in re.finditer(r"(?P<before>[^\n]*)\n\n```(?P<lang>\w+)\n(?P<body>.*?)```", text, re.S):
        before, body = match["before"], match["body"]
        named = re.search(r"`([\w/.]+\.(?:py|yaml))`", before)
        if entry_marker in body:
            out["registry"] = body
        elif named:
            out[Path(named[1]).name] = body
    return out


def tiny_job(n_samples: int, max_response_len: int) -> list[str]:
    """Overrides for a job of a few seconds per stage: a small model, 10 SFT steps, 2 RL steps."""
    return [
        "data.synthetic.n_train=300", "data.synthetic.n_eval=8", "tokenizer.n_training_texts=300",
        "model.hidden_size=64", "model.num_layers=2", "model.moe_intermediate_size=64", "model.intermediate_size=128",
        "rollout.prompts_per_step=4", f"rollout.n_samples_per_prompt={n_samples}",
        f"rollout.max_response_len={max_response_len}", "train.micro_batch_size=16", "sft.steps=10",
        "sft.batch_size=16", "train.steps=2", "run.stages=[data,tokenizer,sft,rl]",
    ]
