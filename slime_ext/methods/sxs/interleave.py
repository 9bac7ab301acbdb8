"""SxS Algorithm 1 (docs/methods/sxs.md): turn (x, r, a) into one think/speak interleaved stream.

Given the reasoning blocks R_1..K_R, the answer blocks A_1..K_A and, for every reasoning prefix
R_1..k, the oracle's count l~_k of answer blocks it entails:
- monotone repair: l_k = max(l_{k-1}, l~_k) (an answer block once unlocked stays unlocked);
- terminal safeguard: l_{K_R} = K_A (the whole answer is given at the end at the latest);
- emit: reasoning blocks accumulate into one think block until l grows; then the think block is
  emitted, followed by a speak block with the newly unlocked answer blocks (adjacent reasoning that
  unlocks nothing is merged); once the full answer is out, the remaining reasoning becomes one
  trailing think block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

THINK_OPEN, THINK_CLOSE, SPEAK_OPEN, SPEAK_CLOSE = "<think>", "</think>", "<speak>", "</speak>"
_BLANKS = re.compile(r"\n\s*\n")


def normalise(text: str) -> str:
    """Strip, unify newlines, and turn every run of blank lines into exactly one blank line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
    return _BLANKS.sub("\n\n", text)


def segment(text: str) -> list[str]:
    """`\\n\\n`-separated blocks of the normalised text (empty blocks dropped)."""
    return [b.strip() for b in normalise(text).split("\n\n") if b.strip()]


def repair(raw_counts: Sequence[int], n_answer: int) -> list[int]:
    """Monotone repair and terminal safeguard of the oracle's per-prefix coverage counts."""
    out, best = [], 0
    for c in raw_counts:
        best = max(best, min(max(int(c), 0), n_answer))
        out.append(best)
    if out:
        out[-1] = n_answer
    return out


@dataclass(frozen=True)
class Block:
    channel: str  # "think" or "speak"
    text: str


def interleave(reasoning: Sequence[str], answer: Sequence[str], raw_counts: Sequence[int]) -> list[Block]:
    """The interleaved blocks for one example (see the module docstring)."""
    if len(raw_counts) != len(reasoning):
        raise ValueError(f"{len(raw_counts)} coverage counts for {len(reasoning)} reasoning blocks")
    if not answer:
        raise ValueError("an example needs at least one answer block")
    if not reasoning:
        return [Block("speak", "\n\n".join(answer))]
    counts = repair(raw_counts, len(answer))
    blocks: list[Block] = []
    pending: list[str] = []
    shown = 0
    for k, (step, count) in enumerate(zip(reasoning, counts)):
        pending.append(step)
        if shown == len(answer):
            continue  # full answer already out: the rest is trailing reasoning
        if count > shown:
            blocks.append(Block("think", "\n\n".join(pending)))
            blocks.append(Block("speak", "\n\n".join(answer[shown:count])))
            pending, shown = [], count
    if pending:
        blocks.append(Block("think", "\n\n".join(pending)))
    return blocks


def render(blocks: Sequence[Block]) -> str:
    """Tagged text: `<think>...</think>` and `<speak>...</speak>` blocks, one after the other."""
    out = []
    for b in blocks:
        o, c = (THINK_OPEN, THINK_CLOSE) if b.channel == "think" else (SPEAK_OPEN, SPEAK_CLOSE)
        out.append(f"{o}{b.text}{c}")
    return "".join(out)


def visible_answer(tagged: str) -> str:
    """The projection a user sees: the speak blocks' text, joined by blank lines."""
    return "\n\n".join(m.strip() for m in re.findall(r"<speak>(.*?)(?:</speak>|$)", tagged, flags=re.DOTALL))


def interleave_row(row: dict) -> dict:
    """A synthetic math row with its solution replaced by the SxS interleaving (rule oracle); the plain
    chain of thought is kept as `cot_solution` (the standard-CoT arm of the study)."""
    return SxSRows()(row)


PLACEMENTS = ("interleaved", "after_reasoning")


@dataclass(frozen=True)
class SxSRows:
    """The row transform of `sxs.interleave_data` with its two data settings (docs/methods/sxs.md):
    - `answer_placement`: "interleaved" (Algorithm 1, rule oracle) or "after_reasoning", the study's control: the
      same think and speak text with the whole account after the reasoning (`<think>steps</think><speak>account
      </speak>`, then the re-check tail), so interleaving is separated from restating the answer;
    - `disclosure_share`: the share of intermediate steps whose running total the account reports
      (`synthetic.disclosed_steps`)."""

    answer_placement: str = "interleaved"
    disclosure_share: float = 1.0

    def __post_init__(self) -> None:
        if self.answer_placement not in PLACEMENTS:
            raise ValueError(f"answer_placement must be one of {PLACEMENTS}, got {self.answer_placement!r}")

    @property
    def cache_key(self) -> str:
        """What keys the prepared data and the warm start: the defaults keep `interleave_row`'s import path (the
        key of the data and warm starts built before these settings existed)."""
        if self == SxSRows():
            return f"{__name__}:interleave_row"
        return f"{__name__}:SxSRows({self.answer_placement},{self.disclosure_share!r})"

    def __call__(self, row: dict) -> dict:
        from slime_ext.methods.sxs.oracles import RuleOracle
        from slime_ext.methods.sxs.synthetic import triple_from_row

        t = triple_from_row(row, self.disclosure_share)
        reasoning, answer = segment(t["reasoning"]), segment(t["answer"])
        if self.answer_placement == "interleaved":
            oracle = RuleOracle()
            counts = [oracle.coverage(t["question"], reasoning[: k + 1], answer, 0, t) for k in range(len(reasoning))]
        else:  # nothing is said before the last step; the tail after it stays a trailing think block
            last_step = max(t["requires"])
            counts = [len(answer) if k >= last_step else 0 for k in range(len(reasoning))]
        return dict(row, solution=render(interleave(reasoning, answer, counts)), cot_solution=row["solution"])
