"""How response text becomes the token ids a model trains on: an observation of a tool (episodes and SFT alike)
and an SFT row's trained part. One rule, used by the SFT batch (`orchestration.training_job.sft_samples`), the
length check that skips rows too long for the context (`lengths.sft_token_ids`) and the episode loop
(`envs.rollout`).

A reference solution without tool calls is tokenised as one string, then EOS; every token is trained. A solution
that calls tools (`tool_solutions`: after a call's `</input>`, the environment's observation `\\n<output>\\n...
\\n</output>\\n` or the `<error>` form) is tokenised the way an episode holds it: each model piece alone (no special
tokens), loss mask 1; each observation by `observation_ids`, loss mask 0; then EOS, mask 1. Tokenising it as one
string would join tokens across the boundaries (the byte-level BPE splits `</input>\\n<output>` as `>\\n`, `<`,
...), tokens no rollout holds, since a turn stops at `</input>` and the observation starts with its own ids.

Why here, in the tasks layer: the length check runs on the tasks layer, which may not import the environments;
the SFT builder and the episode loop may import it. The call's end tag is the tools environment's `CALL_END`
(`slime_ext.envs.tool_call`), written here too, as `tool_solutions` writes the observation; a test keeps them equal.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["observation_ids", "solution_pieces", "sft_response"]

CALL_END = "</input>"  # slime_ext.envs.tool_call.CALL_END
# An observation as the tools environment writes it (tool_call.format_observation), right after a call.
_OBSERVATION = re.compile(re.escape(CALL_END) + r"(\n<(output|error)>\n.*?</\2>\n)", re.DOTALL)


def observation_ids(tokenizer: Any, text: str) -> list[int]:
    """The one tokenisation of an observation: the run's tokenizer, no special tokens added."""
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]] if text else []


def solution_pieces(solution: str) -> list[tuple[str, bool]]:
    """(text, trained) pieces of a solution in order: the model's text (trained) and each observation that
    follows a call (not trained); one trained piece when the solution calls no tool."""
    pieces: list[tuple[str, bool]] = []
    start = 0
    for found in _OBSERVATION.finditer(solution):
        pieces.append((solution[start:found.start(1)], True))
        pieces.append((found.group(1), False))
        start = found.end(1)
    pieces.append((solution[start:], True))
    return [(text, trained) for text, trained in pieces if text]


def sft_response(tokenizer: Any, row: dict) -> tuple[list[int], list[float]]:
    """(response ids, loss mask) an SFT row trains on: its reference solution (the label when it has none)
    tokenised as the module docstring says, EOS appended."""
    solution = str(row.get("solution", row["label"]))
    pieces = solution_pieces(solution)
    eos = int(tokenizer.eos_token_id)
    if all(trained for _, trained in pieces):
        ids = [int(t) for t in tokenizer(solution)["input_ids"]] + [eos]
        return ids, [1.0] * len(ids)
    ids, mask = [], []
    for text, trained in pieces:
        part = ([int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]] if trained
                else observation_ids(tokenizer, text))
        ids += part
        mask += [1.0 if trained else 0.0] * len(part)
    return ids + [eos], mask + [1.0]
