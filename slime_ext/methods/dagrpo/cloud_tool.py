"""DA-GRPO's cloud as a tool of the `tools` environment (docs/methods/dagrpo.md, "The cloud as a tool").

With `rollout.env: tools` and `cloud` in `rollout.env_settings.tools`, the local model asks for help by calling
`<tool>cloud</tool><input>...</input>`; the environment appends the cloud's completion as an observation (loss
mask 0) and the model goes on in its next turn. The question sent is the episode's prompt (its data row), not
the call's argument: as in the splice path the cloud answers the prompt, once per prompt group and batch. The
first episode of a group that calls makes the call; the others wait for it and read the same completion (or the
same failure). So one call serves the group, whichever turn its episodes ask in.

The method lends the tool (`MethodEntry.tools`, built by `Method.env_tools` as `CloudTool(method)`): it uses the
method's `CloudHelper` (client, timeouts, retries, circuit breaker), the method starts a new batch at each plan
and reads the batch's calls (`tally`) when it scores.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from slime_ext.envs.rollout import MAX_ENV_THREADS
from slime_ext.envs.toolbox import Tool, ToolError
from slime_ext.envs.tools_settings import ToolSettings
from slime_ext.methods.dagrpo.cloud import CloudTally

NAME = "cloud"
# The toolbox's limit on one call, waiting for the group's shared call included. Below the environment step's
# 600 s (EpisodeLimits.step_timeout_s), so a call past it is an error observation, not a failed episode; the
# client's own limits (dagrpo.cloud_timeout_s, cloud_retries, the breaker) end a call first (123.5 s for a dead
# endpoint at the defaults).
TIMEOUT_S = 540.0
NO_ANSWER = "the cloud did not answer"  # short: the observation counts against the episode's token budget


class _Answer:
    """One question's call in this batch: its completion (None: no answer) and counts, once `done`."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.text: Optional[str] = None
        self.tally = CloudTally()


class CloudTool(Tool):
    name = NAME

    def __init__(self, method: Any):
        # every episode stepping at once may call (waiters hold a slot); the HTTP client's own cap
        # (dagrpo.cloud_concurrency) bounds the requests in flight
        super().__init__(ToolSettings(timeout_s=TIMEOUT_S, max_concurrency=MAX_ENV_THREADS))
        self.cloud = method.cloud
        self._lock = threading.Lock()
        self._answers: dict[str, _Answer] = {}

    def __getstate__(self) -> dict:
        """Picklable (the method travels to the rollout manager actor): the batch's calls stay behind."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_answers")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._answers = {}

    def new_batch(self) -> None:
        """Forget the calls so far: the next question of each group calls the cloud again (one call per group
        and step, as the splice path)."""
        with self._lock:
            self._answers = {}

    def run(self, arg: str) -> str:
        raise ToolError("the cloud answers an episode's prompt: it is called from an episode")

    def run_for(self, episode: Any, arg: str) -> str:
        question = str(episode.row["prompt"])
        with self._lock:
            answer = self._answers.get(question)
            first = answer is None
            if first:
                answer = self._answers[question] = _Answer()
        if first:
            try:
                (answer.text,), answer.tally = self.cloud.ask([question])
            except BaseException:
                answer.tally = CloudTally(calls=1, failed=1)
                raise
            finally:
                answer.done.set()
        else:
            answer.done.wait()  # the toolbox stops waiting at its time limit
        if answer.text is None:
            raise ToolError(NO_ANSWER)
        return answer.text

    def tally(self) -> CloudTally:
        """The calls of this batch (finished ones): one per question asked."""
        with self._lock:
            answers = list(self._answers.values())
        return sum((a.tally for a in answers if a.done.is_set()), CloudTally())

    def answers(self) -> dict[str, Optional[str]]:
        """question -> the cloud's completion (None: no answer) of this batch's finished calls."""
        with self._lock:
            return {q: a.text for q, a in self._answers.items() if a.done.is_set()}
