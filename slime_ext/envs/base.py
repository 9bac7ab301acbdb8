"""The environment interface: what an environment sees of a turn and what it answers.

An episode is a sequence of turns. In each turn the model generates until a stop (one of the environment's
stop strings or stop token ids, EOS, or the turn's token budget); the environment then answers with
observation *text*, which the loop (`slime_ext.envs.rollout`) tokenises once and appends as tokens. The
environment never sees or returns token ids of the context: it cannot re-tokenise what the model sampled.

One `Environment` object serves a whole run; per-episode state lives in `Episode.state`. `step` may be called
from several threads at once (one per live episode), so an environment keeps shared objects thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class Turn:
    """One model turn as the environment sees it."""

    index: int  # 0 for the first turn
    output_ids: tuple[int, ...]  # the engine's sampled ids of this turn, exactly
    text: str  # those ids decoded (special tokens dropped)
    finish_reason: str  # the engine's: stop (EOS or a stop string / id) | length | sampler


@dataclass
class Episode:
    """What an environment knows of one episode: its data row, the turns so far and its own scratch state."""

    row: dict[str, Any]  # the data row (prompt, label, ...)
    turns: list[Turn] = field(default_factory=list)  # every turn so far, the current one last
    turns_left: int = 0  # model turns that may still follow this one (0: whatever is answered is never read)
    state: dict[str, Any] = field(default_factory=dict)  # the environment's own per-episode state


@dataclass
class EnvStep:
    """The environment's answer to a turn. `observation` is appended (tokenised once, no special tokens added)
    unless `done`; `tool_calls` / `tool_errors` count what this step ran, for the episode's statistics."""

    observation: str = ""
    done: bool = False
    tool_calls: int = 0
    tool_errors: int = 0
    info: dict[str, Any] = field(default_factory=dict)  # kept per turn in the sample's metadata (JSON-able)


class Environment:
    """Base class of environments. Subclasses override `step` (and `stop` / `stop_token_ids` when a turn
    should end on something other than EOS or its budget).

    Built once per run by the registry as `cls(settings, tokenizer)`: `settings` is the validated settings
    model the registry entry names (None when it names none)."""

    stop: tuple[str, ...] = ()  # stop strings that end a turn (matched on the turn's decoded text)
    stop_token_ids: tuple[int, ...] = ()  # stop token ids that end a turn

    def __init__(self, settings: Optional[Any] = None, tokenizer: Optional[Any] = None):
        self.settings = settings
        self.tokenizer = tokenizer

    def step(self, episode: Episode, turn: Turn) -> EnvStep:
        """Answer `turn` (the last of `episode.turns`): an observation to append, or done."""
        raise NotImplementedError
