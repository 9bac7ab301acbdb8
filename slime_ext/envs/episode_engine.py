"""An engine whose every request is an episode of an environment: held-out evaluation of a multi-turn run.

Why: `slime_ext.evaluation.evaluate` sends single requests and scores each response's text. A run with
`rollout.env` trains a model that calls tools; evaluated one turn at a time, it would stop at its first call
(or, without the stop string, invent the tool's answer). Wrapped in this class, each evaluation request runs
as an episode with the same loop, limits and environment as the RL rollouts (`run_episodes`), the score reads
the last turn's text (`final_text`, passed as the evaluation's `project`), and `metrics` gives each episode's
turns and tool calls (the evaluation's `response_metrics`: their means land in the report's meta).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from slime_ext.data.generation import GenerateRequest, GenerateResult
from slime_ext.envs.base import Environment
from slime_ext.envs.registry import build_env
from slime_ext.envs.rollout import EpisodeLimits, EpisodeResult, run_episodes


class EpisodeEngine:
    """`generate(requests)` runs one episode per request over `engine`; the result is the whole episode (prompt
    -> every turn's ids and every observation's), `EpisodeResult.as_result()`."""

    def __init__(self, engine: Any, env: Environment, tokenizer: Any, limits: EpisodeLimits,
                 row_of: Callable[[str], dict[str, Any]]):
        self.engine, self.env, self.tokenizer, self.limits, self.row_of = engine, env, tokenizer, limits, row_of
        self._episodes: dict[str, EpisodeResult] = {}

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        requests = list(requests)
        rows = [self.row_of(q.rid) for q in requests]
        episodes = run_episodes(self.engine.generate, requests, rows, self.env, self.tokenizer, self.limits)
        self._episodes.update((e.rid, e) for e in episodes)
        return [e.as_result() for e in episodes]

    def final_text(self, result: GenerateResult) -> str:
        """The text the verifier scores: the episode's last turn (observations are the environment's words)."""
        return self._episodes[result.rid].final_text

    def metrics(self, result: GenerateResult) -> dict[str, float]:
        """Per episode: model turns, tool calls, tool errors, and whether it called a tool at all."""
        e = self._episodes[result.rid]
        return {"turns": float(len(e.turns)), "tool_calls": float(e.tool_calls), "tool_errors": float(e.tool_errors),
                "called_tool": float(e.tool_calls > 0)}


def episode_evaluation(engine: Any, rollout: Any, tokenizer: Any, row_of: Callable[[str], dict[str, Any]],
                       options: dict[str, Any], tools: Optional[dict[str, Any]] = None
                       ) -> tuple[EpisodeEngine, dict[str, Any]]:
    """(the engine to evaluate with, the evaluation's keyword options) of a run with `rollout.env` (a
    `RolloutConfig`): episodes of its environment under its limits, the last turn scored, each episode's
    turns and tool calls added to the method's per-response metrics. `row_of` maps a request id to its row;
    `tools` are the tool objects the run's method lends (`Method.env_tools`)."""
    if "project" in options:
        raise ValueError("the method projects its responses before scoring, which multi-turn episodes "
                         "(rollout.env) do not support")
    episodes = EpisodeEngine(engine, build_env(rollout.env, rollout.env_settings, tokenizer, tools), tokenizer,
                             EpisodeLimits.of_rollout(rollout), row_of)
    method_metrics = options.get("response_metrics")

    def metrics(result: GenerateResult) -> dict[str, float]:
        return {**(method_metrics(result) if method_metrics else {}), **episodes.metrics(result)}

    return episodes, {**options, "project": episodes.final_text, "response_metrics": metrics}
