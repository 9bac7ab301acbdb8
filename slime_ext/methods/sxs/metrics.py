"""SxS content-latency metrics (docs/methods/sxs.md) over one response's per-token channels.

Token positions are 1-indexed over the full response; tag tokens carry the channel of the block they
open or close. For a response with channels c_1..c_T (THINK = 0, SPEAK = 1):
- ARI: mean position of the speak tokens;
- ABO: mean onset (position of the first token) of the speak blocks;
- AIRW: mean length of the think span right before each speak block (0 when none precedes it);
- think blocks: number of maximal think runs;
- lengths: total, reasoning (think tokens), response (speak tokens);
- first disclosure: position of the first speak token whose text is not in a stoplist of
  acknowledgements ("Sure", "Okay", "Let me work through it", ...), i.e. the first substantive content
  the user sees.

A final EOS token is not content: callers pass the response without it (`content_length`). For a plain
chain of thought (the standard-CoT arm of the study), `cot_channels` gives the equivalent channels: a CoT
discloses nothing before its final answer line, so everything before the line holding the last `\\boxed{`
is one think block and that line (with whatever follows it) the only speak block.
"""

from __future__ import annotations

from statistics import mean
from typing import Any, Optional, Sequence

from sglang_patches.sxs import SPEAK, THINK
ACKNOWLEDGEMENTS = frozenset({"sure", "okay", "ok", "alright", "all right", "right", "well", "so", "yes", "hmm",
                              "let me see", "let me think", "let me work through it", "let me work through this",
                              "good question", "great question", "of course"})
BOXED = "\\boxed{"


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
        if substantive(seen):
            return i
    return None


def substantive(visible: str) -> bool:
    """Whether the visible text so far holds something beyond acknowledgements (and is not the start of one)."""
    rest = strip_acknowledgements(visible)
    return any(ch.isalnum() for ch in rest) and rest not in {a[: len(rest)] for a in ACKNOWLEDGEMENTS}


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


def content_length(output_ids: Sequence[int], eos_token_id: Optional[int]) -> int:
    """Number of content tokens of a response: all of them but a final EOS."""
    n = len(output_ids)
    return n - 1 if n and eos_token_id is not None and output_ids[-1] == eos_token_id else n


def cot_channels(token_texts: Sequence[str]) -> list[int]:
    """Channels of a plain chain-of-thought response (see the module docstring): SPEAK from the first
    token holding a character of the line with the last `\\boxed{` to the end, THINK before; all THINK
    (nothing disclosed) when the response has no `\\boxed{`."""
    text = "".join(token_texts)
    at = text.rfind(BOXED)
    if at < 0:
        return [THINK] * len(token_texts)
    line_start = text.rfind("\n", 0, at) + 1
    out, end = [], 0
    for t in token_texts:
        end += len(t)
        out.append(SPEAK if end > line_start else THINK)
    return out


def cot_latency_metrics(token_texts: Sequence[str]) -> dict[str, float]:
    """`latency_metrics` of a plain chain-of-thought response (per-token texts, final EOS excluded)."""
    return latency_metrics(cot_channels(token_texts), token_texts)


def cot_response_metrics(tokenizer: Any, output_ids: Sequence[int]) -> dict[str, float]:
    """`cot_latency_metrics` of generated token ids (a final EOS dropped, each token decoded alone)."""
    ids = list(output_ids)[: content_length(output_ids, getattr(tokenizer, "eos_token_id", None))]
    return cot_latency_metrics([tokenizer.decode([t]) for t in ids])


def seconds_metrics(deltas: Sequence[Sequence], speak_only: bool) -> dict[str, float]:
    """Latency in seconds of one streamed response (`slime_ext.tools.stream_timing`: [[seconds, text delta], ...],
    the last entry the stream's end): when the user saw the first visible text (`first_visible_s`), the first
    substantive content (`first_disclosure_s`: acknowledgements skipped, as `first_disclosure` does in tokens) and the
    end (`total_s`). `speak_only`: the stream is SxS's speak channel, all of it visible; else it is a plain chain of
    thought, visible from the line of its last `\\boxed{` (`cot_channels`). NaN where nothing was disclosed."""
    nan = float("nan")
    out = {"first_visible_s": nan, "first_disclosure_s": nan, "total_s": float(deltas[-1][0]) if deltas else nan}
    text = "".join(str(d[1]) for d in deltas)
    if speak_only:
        start = 0
    else:
        at = text.rfind(BOXED)
        if at < 0:
            return out
        start = text.rfind("\n", 0, at) + 1
    end = 0
    for seconds, piece in deltas:
        end += len(piece)
        if not piece or end <= start:
            continue
        if out["first_visible_s"] != out["first_visible_s"]:
            out["first_visible_s"] = float(seconds)
        if substantive(text[start:end]):
            out["first_disclosure_s"] = float(seconds)
            break
    return out


def seconds_summary(records: Sequence[dict], speak_only: bool) -> dict[str, float]:
    """Means over prompts of `seconds_metrics` (NaN prompts left out of each mean) and the share of prompts whose
    stream disclosed nothing substantive."""
    per = [seconds_metrics(r["deltas"], speak_only) for r in records]
    out = {}
    for key in ("first_visible_s", "first_disclosure_s", "total_s"):
        values = [m[key] for m in per if m[key] == m[key]]
        out[key] = mean(values) if values else float("nan")
    out["nothing_disclosed"] = sum(m["first_disclosure_s"] != m["first_disclosure_s"] for m in per) / max(len(per), 1)
    return out
