"""Token-in, token-out multi-turn rollouts over any engine.

For a batch of episodes, each turn is ONE `generate(requests)` call for every live episode. A request's
`input_ids` are the episode's prompt ids, then every earlier turn's sampled ids and observation ids, exactly
as they were produced: the engine's output ids are never decoded and re-encoded, and an observation is
tokenised once (the run's tokenizer, no special tokens added) when it is appended. So the engine's prefix
cache serves every later turn (`GenerateResult.cached_tokens`), and every token the trainer trains on is the
token the engine sampled, with the engine's logprob.

Per episode the result holds the response ids (all turns' generated tokens and observation tokens, in order),
`loss_mask` (1 generated, 0 observation), `logprobs` (the engine's for generated tokens, 0.0 for observation
tokens) and per-token annotations (`{}` for observation tokens), plus per-turn records and counts. Routed
experts (rollout routing replay) come from the last turn's result, which covers every token the engine fed:
the prompt, earlier turns and observations (the later call's forward, served from the prefix cache that the
earlier forward wrote), as `RolloutManager._to_sample` keeps the prompt's routing; see docs/environments.md.

`generate` is any engine's `generate(list[GenerateRequest]) -> list[GenerateResult]` (the embedded engine, the
SGLang client, the engine-server pool, a Ray handle wrapped by the caller).
"""

from __future__ import annotations

import dataclasses
import hashlib
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from slime_ext.data.generation import FINISH_FAILED, GenerateRequest, GenerateResult
from slime_ext.envs.base import EnvStep, Environment, Episode, Turn
from slime_ext.tasks.response_tokens import observation_ids  # the one tokenisation of an observation

Generate = Callable[[list[GenerateRequest]], list[GenerateResult]]

MAX_ENV_THREADS = 64  # environment steps (tool calls) of one turn run on at most this many threads

# Why an episode ended (EpisodeResult.finish):
DONE = "done"  # the environment ended it
MAX_TURNS = "max_turns"
MAX_TOTAL_TOKENS = "max_total_tokens"
ABORT = "abort"  # the engine aborted a turn
FAILED = "failed"  # the engine failed a turn
ENV_ERROR = "env_error"  # the environment raised or did not answer within step_timeout_s


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_total_tokens: int  # response tokens of an episode: generated + observation
    max_turn_tokens: Optional[int] = None  # generated tokens per turn; None: the request's max_new_tokens
    step_timeout_s: float = 600.0  # one environment step; past it the episode fails (a bug, not a tool limit)

    @classmethod
    def of_rollout(cls, rollout: Any) -> "EpisodeLimits":
        """The limits a run's `rollout` section sets (`rollout.max_turns` etc., defaults resolved there)."""
        return cls(rollout.episode_turns, rollout.episode_total_tokens, rollout.max_turn_tokens)

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_total_tokens < 1 or (self.max_turn_tokens is not None
                                                                and self.max_turn_tokens < 1):
            raise ValueError(f"episode limits must be >= 1: {self}")


@dataclass
class TurnRecord:
    rid: str  # the turn's request id
    start: int  # offset of its first generated token in the response
    generated: int  # tokens it generated
    observation: int  # observation tokens appended after it
    finish_reason: str  # the engine's
    input_len: int
    cached_tokens: int
    weight_version: Optional[str] = None
    info: dict[str, Any] = field(default_factory=dict)  # the environment's EnvStep.info


@dataclass
class EpisodeResult:
    rid: str
    prompt_len: int
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[float] = field(default_factory=list)
    logprobs: Optional[list[float]] = None
    annotations: list[dict[str, Any]] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    finish: str = ""  # done | max_turns | max_total_tokens | abort | failed | env_error
    finish_reason: str = ""  # as a single response's: stop | sampler | length | abort | failed
    tool_calls: int = 0
    tool_errors: int = 0
    error: Optional[str] = None
    final_text: str = ""  # the last turn's decoded text (the reward's response text)
    last: Optional[GenerateResult] = None  # the last turn's result

    @property
    def generated_tokens(self) -> int:
        return sum(t.generated for t in self.turns)

    @property
    def observation_tokens(self) -> int:
        return sum(t.observation for t in self.turns)

    def as_result(self) -> GenerateResult:
        """The whole episode as one engine result (prompt -> response), for code that takes results."""
        last = self.last
        return GenerateResult(
            rid=self.rid, output_ids=list(self.response_ids),
            logprobs=None if self.logprobs is None else list(self.logprobs),
            finish_reason=self.finish_reason, annotations=list(self.annotations),
            cached_tokens=sum(t.cached_tokens for t in self.turns), prompt_len=self.prompt_len, error=self.error,
            weight_version=last.weight_version if last else None, served_by=last.served_by if last else None,
            routed_experts=last.routed_experts if last else None)

    def token_versions(self, by_rid: dict[str, list[int]]) -> list[int]:
        """Per response token, the weight version that generated it (off-policy runs: `by_rid` holds each turn
        request's per-token versions); an observation token takes the version of the token before it."""
        out: list[int] = []
        for t in self.turns:
            out += list(by_rid.get(t.rid, []))[: t.generated]
            out += [out[-1] if out else 0] * t.observation
        return out

    def stats(self) -> dict[str, Any]:
        """Per-episode statistics (JSON-able; the rollout manager keeps them in `Sample.metadata["env"]`)."""
        return {"turns": len(self.turns), "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "finish": self.finish, "generated_tokens": self.generated_tokens,
                "observation_tokens": self.observation_tokens, "error": self.error,
                "turn_records": [dataclasses.asdict(t) for t in self.turns]}


def turn_seed(seed: int, turn: int) -> int:
    """Turn 0 keeps the request's seed (a one-turn episode draws what a single-turn rollout draws); later turns
    get a pure function of the seed and the turn, so a rerun draws the same."""
    if turn == 0:
        return int(seed)
    digest = hashlib.blake2b(f"turn:{seed}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF


def turn_rid(rid: str, turn: int) -> str:
    return rid if turn == 0 else f"{rid}-t{turn}"


def prompt_affinity(request: GenerateRequest) -> str:
    """Every turn of every episode of one prompt carries this key, so an engine pool sends them where the
    prompt group's first turn went: the engine whose prefix cache holds their earlier turns."""
    if request.affinity is not None:
        return request.affinity
    return hashlib.blake2b(repr(list(request.input_ids)).encode(), digest_size=8).hexdigest()


class _Live:
    """One episode while it runs."""

    def __init__(self, request: GenerateRequest, row: dict[str, Any], limits: EpisodeLimits):
        self.request, self.limits = request, limits
        self.episode = Episode(row=row)
        self.out = EpisodeResult(rid=request.rid, prompt_len=len(request.input_ids),
                                 logprobs=[] if request.return_logprob else None)

    @property
    def ended(self) -> bool:
        return bool(self.out.finish)

    @property
    def budget(self) -> int:
        return self.limits.max_total_tokens - len(self.out.response_ids)

    def end(self, finish: str, finish_reason: str, error: Optional[str] = None) -> None:
        self.out.finish, self.out.finish_reason = finish, finish_reason
        if error is not None:
            self.out.error = error

    def next_request(self, turn: int, env: Environment) -> GenerateRequest:
        q = self.request
        cap = self.limits.max_turn_tokens or q.sampling.max_new_tokens
        stop = list(q.sampling.stop) + [s for s in env.stop if s not in q.sampling.stop]
        stop_ids = list(q.sampling.stop_token_ids) + [int(t) for t in env.stop_token_ids
                                                      if int(t) not in q.sampling.stop_token_ids]
        sampling = dataclasses.replace(q.sampling, max_new_tokens=min(cap, self.budget), stop=stop,
                                       stop_token_ids=stop_ids)
        return dataclasses.replace(q, rid=turn_rid(q.rid, turn), input_ids=list(q.input_ids) + self.out.response_ids,
                                   sampling=sampling, seed=turn_seed(q.seed, turn), affinity=prompt_affinity(q))

    def add_turn(self, q: GenerateRequest, res: GenerateResult, text: str) -> Turn:
        out, ids = self.out, [int(t) for t in res.output_ids]
        out.turns.append(TurnRecord(q.rid, len(out.response_ids), len(ids), 0, res.finish_reason, len(q.input_ids),
                                    int(res.cached_tokens or 0), res.weight_version))
        out.last = res
        out.response_ids += ids
        out.loss_mask += [1.0] * len(ids)
        if out.logprobs is not None:
            if res.logprobs is None or len(res.logprobs) != len(ids):
                if res.finish_reason != FINISH_FAILED:
                    raise ValueError(f"request {q.rid!r} asked for logprobs but the engine returned "
                                     f"{None if res.logprobs is None else len(res.logprobs)} for {len(ids)} tokens")
                out.logprobs += [0.0] * len(ids)
            else:
                out.logprobs += [float(x) for x in res.logprobs]
        notes = list(res.annotations or [])
        out.annotations += notes[: len(ids)] + [{} for _ in range(len(ids) - len(notes))]
        out.final_text = text
        turn = Turn(len(out.turns) - 1, tuple(ids), text, res.finish_reason)
        self.episode.turns.append(turn)
        return turn

    def answer(self, step: EnvStep, tokenizer: Any) -> None:
        """Apply the environment's answer to the last turn: end the episode, or append the observation."""
        out, record = self.out, self.out.turns[-1]
        out.tool_calls += int(step.tool_calls)
        out.tool_errors += int(step.tool_errors)
        record.info = dict(step.info)
        if step.done:
            self.end(DONE, record.finish_reason)
            return
        if self.episode.turns_left == 0:
            self.end(MAX_TURNS if len(out.turns) >= self.limits.max_turns else MAX_TOTAL_TOKENS, "length")
            return
        ids = observation_ids(tokenizer, step.observation)
        if len(ids) >= self.budget:  # no room left for a generated token after it: nothing would read it
            self.end(MAX_TOTAL_TOKENS, "length")
            return
        record.observation = len(ids)
        out.response_ids += ids
        out.loss_mask += [0.0] * len(ids)
        if out.logprobs is not None:
            out.logprobs += [0.0] * len(ids)
        out.annotations += [{} for _ in ids]


def _step_all(env: Environment, live: list[_Live], turns: list[Turn], timeout_s: float) -> list[Any]:
    """Every live episode's environment step, concurrently (tool calls overlap); an exception or a step that
    does not answer within `timeout_s` comes back as the exception."""
    if not live:
        return []
    pool = ThreadPoolExecutor(max_workers=min(len(live), MAX_ENV_THREADS), thread_name_prefix="env-step")
    try:
        futures = [pool.submit(env.step, s.episode, t) for s, t in zip(live, turns)]
        wait(futures, timeout=timeout_s)
        out: list[Any] = []
        for f in futures:
            if not f.done():
                out.append(TimeoutError(f"the environment did not answer within {timeout_s:g} s"))
            elif f.exception() is not None:
                out.append(f.exception())
            else:
                out.append(f.result())
        return out
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def run_episodes(generate: Generate, requests: Sequence[GenerateRequest], rows: Sequence[dict[str, Any]],
                 env: Environment, tokenizer: Any, limits: EpisodeLimits) -> list[EpisodeResult]:
    """Roll out one episode per request (its prompt, sampling, seed, samplers and flags; `rows[i]` is the data
    row the environment sees) until the environment ends it, `limits.max_turns` or `limits.max_total_tokens`."""
    if len(rows) != len(requests):
        raise ValueError(f"{len(requests)} requests but {len(rows)} rows")
    states = [_Live(q, row, limits) for q, row in zip(requests, rows)]
    for turn in range(limits.max_turns):
        live = [s for s in states if not s.ended]
        if not live:
            break
        turn_requests = [s.next_request(turn, env) for s in live]
        results = generate(turn_requests)
        if [r.rid for r in results] != [q.rid for q in turn_requests]:
            raise ValueError("the engine answered other request ids than it was asked, or in another order")
        stepping, turns = [], []
        for s, q, res in zip(live, turn_requests, results):
            ids = [int(t) for t in res.output_ids]
            t = s.add_turn(q, res, tokenizer.decode(ids, skip_special_tokens=True))
            if res.finish_reason == FINISH_FAILED:
                s.end(FAILED, FINISH_FAILED, res.error or "the engine failed the request")
            elif res.finish_reason == "abort":
                s.end(ABORT, "abort")
            else:
                s.episode.turns_left = 0 if s.budget < 1 else limits.max_turns - turn - 1
                stepping.append(s)
                turns.append(t)
        for s, answer in zip(stepping, _step_all(env, stepping, turns, limits.step_timeout_s)):
            if isinstance(answer, BaseException):
                s.end(ENV_ERROR, FINISH_FAILED, f"environment step failed: {type(answer).__name__}: {answer}")
            elif not isinstance(answer, EnvStep):
                s.end(ENV_ERROR, FINISH_FAILED, f"environment step returned {type(answer).__name__}, not EnvStep")
            else:
                s.answer(answer, tokenizer)
    for s in states:  # max_turns reached with the last turn answered by an observation cannot happen (turns_left 0)
        if not s.ended:
            s.end(MAX_TURNS, "length")
    return [s.out for s in states]
