"""One rollout and its per-token annotations, the unit that moves between engine, methods and trainer.

Per-token lists are aligned with `response_ids` (index i describes response token i). They are checked
on construction and on `validate()`, and every error names the sample id so a bad rollout in a batch of
thousands can be found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Optional


class SampleStatus(str, Enum):
    COMPLETED = "completed"  # ended on EOS / stop string
    TRUNCATED = "truncated"  # hit max_response_len
    ABORTED = "aborted"  # ended early on purpose (DUET abort gate, engine abort)
    FAILED = "failed"  # the engine or a remote call failed; never trained on


class Author(IntEnum):
    """Who produced a response token. Tandem: POLICY is the senior, PARTNER the frozen junior."""

    PARTNER = 0
    POLICY = 1
    EXTERNAL = 2  # text spliced in from outside (DA-GRPO cloud completion)


def author_weights(junior_weight: float) -> dict[int, float]:
    """Training weight of a token by its author (tandem): senior 1, junior `junior_weight`, spliced
    external text 0."""
    return {int(Author.POLICY): 1.0, int(Author.PARTNER): float(junior_weight), int(Author.EXTERNAL): 0.0}


class Channel(IntEnum):
    """SxS stream channel of a token."""

    THINK = 0
    SPEAK = 1


PER_TOKEN_FIELDS = ("loss_mask", "author", "channel", "logprobs", "token_versions")


class SampleValidationError(ValueError):
    """A sample's fields are inconsistent; the message names the sample and the field."""


@dataclass
class Sample:
    """A prompt, one sampled response and everything the trainer and methods attach to it."""

    sample_id: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    group_id: Optional[str] = None  # samples of one prompt share a group (GRPO baseline)
    # Per-token (aligned with response_ids). loss_mask defaults to all ones; it may hold fractional
    # weights (e.g. Tandem's junior-token weight) in [0, 1].
    loss_mask: Optional[list[float]] = None
    author: Optional[list[int]] = None
    channel: Optional[list[int]] = None
    logprobs: Optional[list[float]] = None  # the engine's logprob of each response token
    # The weight version that generated each response token (off-policy runs: `rollout.off_policy_steps`
    # 1; a partial rollout resumed after a weight sync holds two versions). None on on-policy runs.
    token_versions: Optional[list[int]] = None
    # Per-sample.
    reward: Optional[float] = None
    rewards: dict[str, float] = field(default_factory=dict)  # named components (format, correctness, ...)
    advantage: Optional[float] = None
    cost: float = 0.0
    weight: float = 1.0
    status: SampleStatus = SampleStatus.COMPLETED
    label: Any = None
    response_text: Optional[str] = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.status, SampleStatus):
            try:
                self.status = SampleStatus(self.status)
            except ValueError:
                valid = ", ".join(s.value for s in SampleStatus)
                raise SampleValidationError(
                    f"sample {self.sample_id!r}: status {self.status!r} is not one of {valid}"
                ) from None
        if self.loss_mask is None:
            self.loss_mask = [1.0] * len(self.response_ids)
        self.validate()

    @property
    def response_len(self) -> int:
        return len(self.response_ids)

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def validate(self) -> None:
        """Raise SampleValidationError if any per-token field is misaligned or out of range."""
        sid = self.sample_id
        if not self.prompt_ids:
            raise SampleValidationError(f"sample {sid!r}: empty prompt_ids")
        n = len(self.response_ids)
        for name in PER_TOKEN_FIELDS:
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise SampleValidationError(
                    f"sample {sid!r}: {name} has {len(values)} entries but response_ids has {n} tokens"
                )
        if any(not (0.0 <= m <= 1.0) for m in self.loss_mask):
            raise SampleValidationError(f"sample {sid!r}: loss_mask values must lie in [0, 1]")
        if self.author is not None and any(a not in (0, 1, 2) for a in self.author):
            raise SampleValidationError(f"sample {sid!r}: author values must be 0, 1 or 2 ({list(Author)})")
        if self.channel is not None and any(c not in (0, 1) for c in self.channel):
            raise SampleValidationError(f"sample {sid!r}: channel values must be 0 (think) or 1 (speak)")
        if self.token_versions is not None and any(not isinstance(v, int) or v < 0 for v in self.token_versions):
            raise SampleValidationError(f"sample {sid!r}: token_versions must be weight versions (ints >= 0)")
        if self.weight < 0:
            raise SampleValidationError(f"sample {sid!r}: weight {self.weight} is negative")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (for rollout dumps and resume)."""
        out = dict(self.__dict__)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sample":
        return cls(**data)
