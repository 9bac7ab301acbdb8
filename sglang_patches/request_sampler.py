"""The per-request sampler protocol: the engine-side logic of every method, host-independent.

A `Sampler` is created once per request (from a JSON-able spec and the request seed) and consulted at
every decode step. It is plain PyTorch on one row of logits, so the same object runs inside the
embedded engine and inside SGLang (hosted by a CustomLogitProcessor, see `sglang_adapter`):

    adjust(logits, partner_logits, view) -> StepAction   before the token is chosen: may return
                                                          modified logits, force a token, or end
    on_token(token_id, view) -> dict                     after it is chosen: annotate it (author,
                                                          channel, flags) and advance the state;
                                                          `view.output_ids` excludes `token_id`

How the four methods fit (docs/methods/):
- Tandem: `needs_partner`; `adjust` returns the senior's or the junior's logits by `author_next`,
  `on_token` records the author and redraws the coin after a boundary token or kappa tokens.
- DUET: `adjust` polls the marker on the decoded tail, forces EOS at a low-entropy token after it, or
  aborts (forces EOS, flags `did_abort` and the propensity) with the request's coin stream.
- SxS: `on_token` annotates the channel from think/speak tags; `adjust` can mask ill-formed tags.
- DA-GRPO: `on_token` sees the decoded tail end with the help trigger and `adjust` ends the request;
  the flag `asked_for_help` marks the sample.

State lives in the sampler instance (one per request, never shared), is serialisable
(`state_dict` / `load_state_dict`), and all randomness comes from counter-based `CoinStream`s seeded
from the request seed, so a rollout's decisions depend only on its seed and its own tokens, not on
batching or on how often the host called the sampler. Hosts that cannot report per-token annotations
(SGLang) recover them exactly by replaying `on_token` over the output ids (`replay_annotations`).
"""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, Sequence

import torch

FINISH_SAMPLER = "sampler"  # finish reason when a sampler ends a request


class CoinStream:
    """Counter-based uniform draws: draw k of (seed, name) is a pure function of (seed, name, k).

    Reproducible across processes, batch compositions and hosts, and serialisable as three numbers.
    """

    def __init__(self, seed: int, name: str, counter: int = 0):
        self.seed, self.name, self.counter = int(seed), name, int(counter)

    def uniform(self) -> float:
        digest = hashlib.blake2b(f"{self.seed}:{self.name}:{self.counter}".encode(), digest_size=8).digest()
        self.counter += 1
        return (int.from_bytes(digest, "little") >> 11) / float(1 << 53)

    def bernoulli(self, p: float) -> bool:
        return self.uniform() < p

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "name": self.name, "counter": self.counter}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CoinStream":
        return cls(d["seed"], d["name"], d["counter"])


@dataclass
class RequestView:
    """What a sampler may look at: the request's identity and the response so far (read-only)."""

    rid: str
    seed: int
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    eos_token_id: int
    decode: Optional[Callable[[Sequence[int]], str]] = None

    @property
    def step(self) -> int:
        return len(self.output_ids)

    def tail_text(self, n_tokens: int) -> str:
        if self.decode is None:
            raise RuntimeError(f"request {self.rid}: this sampler needs a tokenizer to decode text")
        return self.decode(list(self.output_ids[-n_tokens:]))


@dataclass
class StepAction:
    """A sampler's decision for one step. `logits=None` keeps them; `force_token` pins the next token;
    `finish=True` ends the request now by forcing EOS (a host-independent way to stop)."""

    logits: Optional[torch.Tensor] = None
    force_token: Optional[int] = None
    finish: bool = False


class Sampler:
    """Base class: a no-op sampler. Subclasses override `adjust` / `on_token` and list their state."""

    kind: ClassVar[str] = "base"
    needs_partner: ClassVar[bool] = False
    needs_decode: ClassVar[bool] = False

    def __init__(self, seed: int, **params: Any):
        if params:
            raise TypeError(f"sampler {self.kind!r} got unknown parameters {sorted(params)}")
        self.seed = int(seed)

    def adjust(self, logits: torch.Tensor, partner_logits: Optional[torch.Tensor], view: RequestView) -> StepAction:
        return StepAction()

    def on_token(self, token_id: int, view: RequestView) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {k: (v.to_dict() if isinstance(v, CoinStream) else v) for k, v in self.__dict__.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            current = self.__dict__.get(key)
            self.__dict__[key] = CoinStream.from_dict(value) if isinstance(current, CoinStream) else value


SAMPLER_REGISTRY: dict[str, type[Sampler]] = {}


def register_sampler(cls: type[Sampler]) -> type[Sampler]:
    """Class decorator: make a sampler constructible from a spec `{"kind": cls.kind, **params}`."""
    if cls.kind in SAMPLER_REGISTRY and SAMPLER_REGISTRY[cls.kind] is not cls:
        raise ValueError(f"sampler kind {cls.kind!r} registered twice")
    SAMPLER_REGISTRY[cls.kind] = cls
    return cls


# Sampler modules the process that started this one declares (comma-separated): the run's driver puts its method's
# registry entry's `samplers` here for the engines it starts, so a method registered at run time (a plugin, a
# test) is known to engine processes whose own registry lacks it.
SAMPLER_MODULES_ENV = "SLIME_SAMPLER_MODULES"


def registered_sampler_modules() -> list[str]:
    """The sampler modules of every registered method (their registry entries' `samplers`) and those the
    starting process declared (`SLIME_SAMPLER_MODULES`): the only modules an engine or server imports to build
    samplers from specs."""
    from slime_ext.methods.registry import sampler_modules  # the registry names code; it imports none

    declared = [m.strip() for m in os.environ.get(SAMPLER_MODULES_ENV, "").split(",") if m.strip()]
    return sorted(set(sampler_modules()) | set(declared))


def import_sampler_modules(names: Any) -> None:
    """Import sampler modules a request names, one name or a list (so their kinds register in this process); a
    module that no registered method declares is refused: a request must not make a server import arbitrary
    code. Raises ValueError naming the module (undeclared, or declared but not importable)."""
    allowed = set(registered_sampler_modules())
    for name in map(str, names if isinstance(names, list) else [names]):
        if name not in allowed:
            raise ValueError(f"sampler module {name!r} is not declared by any registered method "
                             f"(registered: {sorted(allowed)})")
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ValueError(f"sampler module {name!r} cannot be imported: {exc}") from None


def _import_registered_samplers() -> None:
    """Register every method's samplers in this process (engine actors and SGLang workers build samplers from
    specs without having imported the method code)."""
    for module in registered_sampler_modules():
        importlib.import_module(module)


def build_sampler(spec: dict[str, Any], seed: int) -> Sampler:
    if spec.get("kind") not in SAMPLER_REGISTRY:
        _import_registered_samplers()
    params = dict(spec)
    kind = params.pop("kind", None)
    if kind not in SAMPLER_REGISTRY:
        raise ValueError(f"unknown sampler kind {kind!r}; registered: {sorted(SAMPLER_REGISTRY)}")
    try:
        return SAMPLER_REGISTRY[kind](seed, **params)
    except TypeError as exc:
        raise TypeError(f"sampler {kind!r}: bad parameters {sorted(params)}: {exc}") from None


@dataclass
class SamplerChain:
    """The samplers of one request, consulted in order. The first forced token (or finish) wins and
    later samplers are not asked to adjust; every sampler sees every chosen token. Annotations are
    merged; two samplers writing the same key is an error (it would be ambiguous)."""

    samplers: list[Sampler] = field(default_factory=list)

    @classmethod
    def from_specs(cls, specs: Sequence[dict[str, Any]], seed: int) -> "SamplerChain":
        return cls([build_sampler(s, seed) for s in specs])

    @property
    def needs_partner(self) -> bool:
        return any(s.needs_partner for s in self.samplers)

    @property
    def needs_decode(self) -> bool:
        return any(s.needs_decode for s in self.samplers)

    def adjust(self, logits: torch.Tensor, partner_logits: Optional[torch.Tensor], view: RequestView) -> StepAction:
        current = logits
        for sampler in self.samplers:
            action = sampler.adjust(current, partner_logits, view)
            if action.finish:
                return StepAction(logits=current, force_token=view.eos_token_id, finish=True)
            if action.force_token is not None:
                return StepAction(logits=current, force_token=int(action.force_token))
            if action.logits is not None:
                current = action.logits
        return StepAction(logits=current)

    def on_token(self, token_id: int, view: RequestView) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for sampler in self.samplers:
            for key, value in sampler.on_token(token_id, view).items():
                if key in merged:
                    raise ValueError(f"samplers {[s.kind for s in self.samplers]} both annotate {key!r}")
                merged[key] = value
        return merged

    def state_dict(self) -> list[dict[str, Any]]:
        return [s.state_dict() for s in self.samplers]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        for sampler, state in zip(self.samplers, states):
            sampler.load_state_dict(state)


def replay_annotations(
    specs: Sequence[dict[str, Any]], seed: int, prompt_ids: Sequence[int], output_ids: Sequence[int],
    eos_token_id: int, decode: Optional[Callable[[Sequence[int]], str]] = None, rid: str = "",
) -> list[dict[str, Any]]:
    """Per-token annotations of a finished response, recomputed from its seed and tokens.

    Valid because a sampler's state advances only in `on_token` and depends only on the request seed
    and the emitted tokens (the protocol's contract); hosts like SGLang that cannot return per-token
    annotations use this after the request finishes.
    """
    return replay_with_finish(specs, seed, prompt_ids, output_ids, eos_token_id, decode, rid)[0]


def replay_with_finish(
    specs: Sequence[dict[str, Any]], seed: int, prompt_ids: Sequence[int], output_ids: Sequence[int],
    eos_token_id: int, decode: Optional[Callable[[Sequence[int]], str]] = None, rid: str = "",
    vocab_size: Optional[int] = None,
) -> tuple[list[dict[str, Any]], bool]:
    """The annotations, and whether the final EOS was a sampler's finish (SGLang reports that EOS as a
    matched stop token; the embedded engine says "sampler"). The finish is recomputed by asking the chain
    to adjust at the last position, which by the protocol's contract changes no state `on_token` reads;
    a sampler that cannot adjust on placeholder logits counts as not finishing."""
    chain = SamplerChain.from_specs(specs, seed)
    out = []
    finished = False
    for i, token in enumerate(output_ids):
        view = RequestView(rid, seed, prompt_ids, output_ids[:i], eos_token_id, decode)
        if i == len(output_ids) - 1 and int(token) == eos_token_id and chain.samplers:
            width = max(int(vocab_size or 0), eos_token_id + 1)
            try:
                placeholder = torch.zeros(width)
                finished = chain.adjust(placeholder, placeholder.clone() if chain.needs_partner else None, view).finish
            except Exception:  # noqa: BLE001 - placeholder logits a sampler cannot use: no finish inferred
                finished = False
        out.append(chain.on_token(int(token), view))
    return out, finished
