"""One rollout and its per-token annotations, the unit that moves between engine, methods and trainer.

Per-token lists are aligned with `response_ids` (index i describes response token i). They are checked
on construction and on `validate()`, and every error names the sample id so a bad rollout in a batch of
thousands can be found.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Optional


class SampleStatus(str, Enum):
    COMPLETED = "completed"  # ended on EOS / stop string
    TRUNCATED = "truncated"  # hit max_response_len
    ABORTED = "aborted"  # ended early on purpose (DUET abort gate, engine abort)
    FAILED = "failed"  # the engine or a remote call failed; never trained on


class Author(IntEnum):
    """Who produced a response token. Tandem: POLICY is the senior, PARTNER the frozen junior.

    The one definition of these values: the tandem sampler (`sglang_patches.tandem`, SENIOR / JUNIOR)
    annotates them as plain ints."""

    PARTNER = 0
    POLICY = 1
    EXTERNAL = 2  # text spliced in from outside (DA-GRPO cloud completion)


def author_weights(junior_weight: float) -> dict[int, float]:
    """Training weight of a token by its author (tandem): senior 1, junior `junior_weight`, spliced
    external text 0."""
    return {int(Author.POLICY): 1.0, int(Author.PARTNER): float(junior_weight), int(Author.EXTERNAL): 0.0}


class Channel(IntEnum):
    """SxS stream channel of a token. The one definition of these values: the SxS channel sampler
    (`sglang_patches.sxs`, THINK / SPEAK) annotates them as plain ints."""

    THINK = 0
    SPEAK = 1


_AUTHOR_VALUES = frozenset(int(a) for a in Author)
_CHANNEL_VALUES = frozenset(int(c) for c in Channel)


PER_TOKEN_FIELDS = ("loss_mask", "author", "channel", "logprobs", "token_versions", "token_advantages")


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
    # Rollout routing replay (MoE): the engine's top-k expert ids per token of prompt + response and MoE
    # layer, an integer tensor [total_len - 1, moe_layers, top_k] (row t: the forward at token t; the last
    # token is never fed to the engine). -1 (NOT_ROUTED) marks tokens the engine did not route (spliced
    # text): the trainer's router chooses for them. None: no routing recorded. See docs/routing-replay.md.
    routed_experts: Any = None
    # The weight version that generated each response token (asynchronous runs: `rollout.max_staleness`
    # >= 1; a partial rollout resumed after weight syncs holds several versions). None on on-policy runs.
    token_versions: Optional[list[int]] = None
    # A per-token term the trainer adds to `advantage` on each response token (a method's dense signal, e.g.
    # on-policy distillation's teacher-minus-student logprob). None: the sample's advantage alone.
    token_advantages: Optional[list[float]] = None
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
        if self.author is not None and any(a not in _AUTHOR_VALUES for a in self.author):
            raise SampleValidationError(f"sample {sid!r}: author values must be 0, 1 or 2 ({list(Author)})")
        if self.channel is not None and any(c not in _CHANNEL_VALUES for c in self.channel):
            raise SampleValidationError(f"sample {sid!r}: channel values must be 0 (think) or 1 (speak)")
        if self.token_advantages is not None and any(not math.isfinite(a) for a in self.token_advantages):
            raise SampleValidationError(f"sample {sid!r}: token_advantages must be finite numbers")
        if self.token_versions is not None and any(not isinstance(v, int) or v < 0 for v in self.token_versions):
            raise SampleValidationError(f"sample {sid!r}: token_versions must be weight versions (ints >= 0)")
        if self.weight < 0:
            raise SampleValidationError(f"sample {sid!r}: weight {self.weight} is negative")
        if self.routed_experts is not None:
            self._validate_routed_experts()

    def _validate_routed_experts(self) -> None:
        import torch

        sid = self.sample_id
        r = self.routed_experts
        if not isinstance(r, torch.Tensor):
            self.routed_experts = r = decode_routed_experts(r, sid)
        if r.dim() != 3 or r.dtype.is_floating_point or r.dtype == torch.bool:
            raise SampleValidationError(f"sample {sid!r}: routed_experts must be an integer tensor [total_len - 1, "
                                        f"moe_layers, top_k], got {r.dtype} of shape {tuple(r.shape)}")
        if r.shape[0] != self.total_len - 1:
            raise SampleValidationError(f"sample {sid!r}: routed_experts has {r.shape[0]} token rows but prompt + "
                                        f"response has {self.total_len} tokens (expected total_len - 1 = "
                                        f"{self.total_len - 1})")
        if r.numel() and int(r.min()) < NOT_ROUTED:
            raise SampleValidationError(f"sample {sid!r}: routed_experts values must be expert ids >= 0 or "
                                        f"{NOT_ROUTED} (not routed)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (for rollout dumps and resume)."""
        out = dict(self.__dict__)
        out["status"] = self.status.value
        if self.routed_experts is not None:
            out["routed_experts"] = encode_routed_experts(self.routed_experts)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sample":
        return cls(**data)  # routed_experts is decoded by validation


NOT_ROUTED = -1


def encode_routed_experts(routed: Any) -> dict[str, Any]:
    """JSON form of a routed-experts tensor: {"dtype", "shape", "base64"} (little-endian bytes)."""
    import base64

    import numpy as np
    import torch

    t = torch.as_tensor(routed)
    arr = t.numpy().astype(np.dtype(str(t.dtype).replace("torch.", "")).newbyteorder("<"), copy=False)
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
            "base64": base64.b64encode(arr.tobytes()).decode("ascii")}


def decode_routed_experts(value: Any, sample_id: str = "?") -> Any:
    """A routed-experts tensor from `encode_routed_experts`' dict, a nested list or an array."""
    import base64

    import numpy as np
    import torch

    try:
        if isinstance(value, dict):
            dtype = np.dtype(value["dtype"]).newbyteorder("<")
            arr = np.frombuffer(base64.b64decode(value["base64"]), dtype=dtype).reshape(value["shape"])
            return torch.from_numpy(arr.astype(dtype.newbyteorder("="), copy=True))
        return torch.as_tensor(np.asarray(value, dtype=np.int32))
    except Exception as exc:  # noqa: BLE001
        raise SampleValidationError(f"sample {sample_id!r}: routed_experts cannot be decoded: {exc}") from None


def splice_routed_experts(routed: Any, kept: list[int], new_total_len: int) -> Any:
    """Routing of a sample whose tokens were rearranged after generation (e.g. DA-GRPO's cloud splice).

    `kept[j]` is the original position (in prompt + response) of new token j for the tokens kept from the
    engine's sequence; tokens after them (spliced in from outside) and kept tokens the engine never fed
    (its last one) get NOT_ROUTED. Returns [new_total_len - 1, moe_layers, top_k]."""
    import torch

    if routed is None:
        return None
    routed = torch.as_tensor(routed)
    out = torch.full((new_total_len - 1, *routed.shape[1:]), NOT_ROUTED, dtype=routed.dtype)
    for j, src in enumerate(kept[: new_total_len - 1]):
        if 0 <= src < routed.shape[0]:
            out[j] = routed[src]
    return out
