"""SxS content-latency metrics (METHODS.md section 3) over one response's per-token channels.

Token positions are 1-indexed over the full response; tag tokens carry the channel of the block they
open or close. For a response with channels c_1..c_T (THINK = 0, SPEAK = 1):
- ARI: mean position of the speak tokens;
- ABO: mean onset (position of the first token) of the speak blocks;
- AIRW: mean length of the think span right before each speak block (0 when none precedes it);
- think blocks: number of maximal think runs;
- lengths: total, reasoning (think tokens), response (speak tokens);
- first disclosure: position of the first speak token whose text is not in a stoplist of
  acknowledgements ("Sure", "Okay", ...), i.e. the first substantive content the user sees.
"""

from __future__ import annotations

from statistics import mean
from typing import Optional, Sequence

THINK, SPEAK = 0, 1
ACKNOWLEDGEMENTS = frozenset({"sure", "okay", "ok", "alright", "all right", "right", "well", "so", "yes", "hmm",
                              "let me see", "let me think", "good question", "great question", "of course"})


def runs(channels: Sequence[int]) -> list[tuple[int, int, int]]:
    """(channel, first position (1-indexed), length) of each maximal run."""
    out: list[tuple[int, int, int]] = []
    for i, c in enumerate(channels, start=1):
        if out and out[-1][0] == c:
            ch, start, n = out[-1]
            out[-1] = (ch, start, n + 1)
        else:
            out.append((int(c), i, 1))
    return out


def strip_acknowledgements(text: str) -> str:
    """The text without leading acknowledgement phrases and punctuation ("Sure, okay! The ..." -> "the ...")."""
    t = text.lower()
    while True:
        t = t.lstrip(" ,.!?;:-\n\t")
        for ack in sorted(ACKNOWLEDGEMENTS, key=len, reverse=True):
            if t.startswith(ack) and (len(t) == len(ack) or not t[len(ack)].isalnum()):
                t = t[len(ack):]
                break
        else:
            return t


def first_disclosure(channels: Sequence[int], token_texts: Optional[Sequence[str]] = None) -> Optional[int]:
    """Position of the first speak token at which the visible text holds something beyond
    acknowledgements (without token texts: the first speak token)."""
    speak = [i for i, c in enumerate(channels, start=1) if c == SPEAK]
    if not speak or token_texts is None:
        return speak[0] if speak else None
    seen = ""
    for i in speak:
        seen += token_texts[i - 1]
        rest = strip_acknowledgements(seen)
        if any(ch.isalnum() for ch in rest) and rest not in {a[: len(rest)] for a in ACKNOWLEDGEMENTS}:
            return i
    return None


def latency_metrics(channels: Sequence[int], token_texts: Optional[Sequence[str]] = None) -> dict[str, float]:
    r = runs(channels)
    speak_pos = [i for i, c in enumerate(channels, start=1) if c == SPEAK]
    speak_runs = [(k, run) for k, run in enumerate(r) if run[0] == SPEAK]
    windows = [r[k - 1][2] if k > 0 and r[k - 1][0] == THINK else 0 for k, _ in speak_runs]
    nan = float("nan")
    fd = first_disclosure(channels, token_texts)
    return {
        "ari": mean(speak_pos) if speak_pos else nan,
        "abo": mean(run[1] for _, run in speak_runs) if speak_runs else nan,
        "airw": mean(windows) if windows else nan,
        "think_blocks": float(sum(1 for run in r if run[0] == THINK)),
        "total_len": float(len(channels)),
        "reasoning_len": float(sum(1 for c in channels if c == THINK)),
        "response_len": float(len(speak_pos)),
        "first_disclosure": float(fd) if fd is not None else nan,
    }
