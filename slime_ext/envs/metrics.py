"""Step metrics of a batch of multi-turn episodes (`env/*` in metrics.jsonl)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from slime_ext.envs.rollout import ABORT, DONE, ENV_ERROR, FAILED, MAX_TOTAL_TOKENS, MAX_TURNS, EpisodeResult

FINISHES = (DONE, MAX_TURNS, MAX_TOTAL_TOKENS, ABORT, FAILED, ENV_ERROR)


def cached_token_share(episodes: Sequence[EpisodeResult], first_turn: bool = False) -> float:
    """Share of the input tokens of later turns (turn >= 1; all turns with `first_turn`) that the engine
    served from its prefix cache (`GenerateResult.cached_tokens` over the request's input length)."""
    turns = [t for e in episodes for i, t in enumerate(e.turns) if first_turn or i > 0]
    inputs = sum(t.input_len for t in turns)
    return sum(t.cached_tokens for t in turns) / inputs if inputs else 0.0


def episode_metrics(episodes: Sequence[EpisodeResult]) -> dict[str, float]:
    n = max(len(episodes), 1)
    calls = sum(e.tool_calls for e in episodes)
    finishes = Counter(e.finish for e in episodes)
    out = {
        "env/turns_mean": sum(len(e.turns) for e in episodes) / n,
        "env/tool_calls_mean": calls / n,
        "env/tool_call_share": sum(e.tool_calls > 0 for e in episodes) / n,  # episodes that called a tool at all
        "env/tool_error_rate": sum(e.tool_errors for e in episodes) / calls if calls else 0.0,
        "env/generated_tokens_mean": sum(e.generated_tokens for e in episodes) / n,
        "env/observation_tokens_mean": sum(e.observation_tokens for e in episodes) / n,
        "env/cached_token_share_later_turns": cached_token_share(episodes),
        "env/cached_token_share": cached_token_share(episodes, first_turn=True),
    }
    out.update({f"env/finish_{name}": finishes.get(name, 0) / n for name in FINISHES})
    return out
