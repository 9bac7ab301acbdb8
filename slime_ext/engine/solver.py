"""An engine that answers synthetic math exactly: the embedded stand-in for a much stronger cloud model.

DA-GRPO's embedded study needs a "cloud" far better than the local model on the hard phase. Served by
`python -m slime_ext.tools.serve --solver synthetic_math`, it sits behind the same OpenAI-compatible routes
as a model, so `CloudHelper` and its HTTP client are exercised exactly as against a real endpoint.
Text goes in and out through a character tokenizer: the cloud's token ids never reach the local model
(DA-GRPO re-tokenises the completion it splices).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from slime_ext.data.generation import GenerateRequest, GenerateResult, check_unique_rids
from slime_ext.tasks.synthetic_math import solve_story


def _final_answer_only(text: str) -> Optional[str]:
    solution = solve_story(text)
    return solution.rsplit("\n", 1)[-1] if solution else None


# synthetic_math: the whole solution; synthetic_math_answer: its `\boxed{N}` line only, so a DA-GRPO
# composition (local steps, then the cloud in place of the trigger) stays a well-formed solution. Both read
# v1 and task family v2 stories (`solve_story` is the one place that tells them apart).
SOLVERS: dict[str, Callable[[str], Optional[str]]] = {"synthetic_math": solve_story,
                                                      "synthetic_math_answer": _final_answer_only}
UNSOLVED = "I cannot solve this."


class CharTokenizer:
    """Unicode code points as token ids; id 0 is the end of sequence."""

    eos_token_id = 0
    vocab_size = 0x110000  # every code point; the server refuses larger ids before chr() would
    max_chars_per_token = 1  # the server refuses a prompt longer than its token limit before tokenising it

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != self.eos_token_id)


class SolverEngine:
    """`generate` returns the solver's whole answer to the prompt text.

    `max_new_tokens` is not applied: it counts the client's model tokens, not characters, and an exact
    answer is short (the client's own limits apply to the text it splices)."""

    def __init__(self, solver: str):
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; known: {sorted(SOLVERS)}")
        self.solve, self.tokenizer = SOLVERS[solver], CharTokenizer()

    def generate(self, requests: list[GenerateRequest],
                 on_token: Optional[Callable[[str, int], None]] = None) -> list[GenerateResult]:
        check_unique_rids(requests)
        out = []
        for req in requests:
            answer = self.solve(self.tokenizer.decode(req.input_ids)) or UNSOLVED
            ids = self.tokenizer(answer)["input_ids"] + [self.tokenizer.eos_token_id]
            for tok in ids:
                if on_token is not None:
                    on_token(req.rid, tok)
            out.append(GenerateResult(req.rid, ids, [0.0] * len(ids) if req.return_logprob else None, "stop",
                                      [{} for _ in ids], 0, len(req.input_ids)))
        return out

    def metrics(self) -> dict[str, Any]:
        return {}
