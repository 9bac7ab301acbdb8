"""SFT on reference solutions that call tools: tokenised the way an episode is, observations not trained.

A tool-call solution (`slime_ext.tasks.tool_solutions`) holds the model's text and, after each call's
`</input>`, the environment's observation (`\\n<output>\\n...\\n</output>\\n` or the `<error>` form). An episode's
response is: the turn's sampled ids up to the stop string, the observation tokenised once and alone
(`rollout.observation_ids`), the next turn's ids. So the SFT response is built from the same pieces: each model
piece tokenised alone (no special tokens) with loss mask 1, each observation by `observation_ids` with loss
mask 0, then EOS (mask 1). Tokenising the solution as one string instead would join tokens across the
boundaries (the byte-level BPE splits `</input>\\n<output>` as `>\\n`, `<`, ...): the warm start would then teach
tokens that no rollout holds, since a turn stops at `</input>` and the observation starts with its own ids.
A solution without an observation is not touched here (the caller keeps its one-string tokenisation).
"""

from __future__ import annotations

import re
from typing import Any, Optional

from slime_ext.envs.rollout import observation_ids
from slime_ext.envs.tool_call import CALL_END

# An observation as the tools environment writes it (tool_call.format_observation), right after a call.
_OBSERVATION = re.compile(re.escape(CALL_END) + r"(\n<(output|error)>\n.*?</\2>\n)", re.DOTALL)


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


def tool_sft_response(tokenizer: Any, solution: str) -> Optional[tuple[list[int], list[float]]]:
    """(response ids, loss mask) of a solution with observations, EOS appended; None when it has none."""
    pieces = solution_pieces(solution)
    if all(trained for _, trained in pieces):
        return None
    ids: list[int] = []
    mask: list[float] = []
    for text, trained in pieces:
        part = ([int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]] if trained
                else observation_ids(tokenizer, text))
        ids += part
        mask += [1.0 if trained else 0.0] * len(part)
    ids.append(int(tokenizer.eos_token_id))
    mask.append(1.0)
    return ids, mask
