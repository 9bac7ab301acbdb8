"""Host our per-request samplers (`sampler.Sampler`) inside SGLang as a CustomLogitProcessor.

How SGLang drives it (sglang 0.5.21, read from its source):
- the server must run with `--enable-custom-logit-processor`; a request carries the processor class as
  the top-level `custom_logit_processor` string (`SamplerLogitProcessor.to_str()`, a dill pickle of the
  class by reference, so the server must be able to import this module) and its parameters in
  `sampling_params["custom_params"]`;
- `Req.__init__` copies `custom_params` and adds `"__req__"`: the live `Req` (`rid`, `origin_input_ids`,
  `output_ids`, `finished()`);
- before sampling, `layers/sampler.py::apply_custom_logit_processor` selects the rows of the requests
  using one processor string, calls `processor(selected_logits, custom_params_of_those_rows)` and copies
  the returned rows back. A new processor instance is built per batch (`from_str`), so all per-request
  state lives in a process-level registry here, keyed by rid.

Custom params (all values JSON scalars or strings: SGLang types `custom_params` values as scalars, lists
of scalars or flat dicts, and its msgpack IPC rejects anything nested, so the specs travel as a JSON
string; see `build_custom_params`):
    sampler_specs    JSON list of sampler specs for `SamplerChain.from_specs` (a list is also accepted)
    seed             the request seed (the samplers' coin streams derive from it)
    eos_token_id     the token a sampler's `finish` forces
    rid              the logical request id shown to samplers (the client may retry under another rid)
    tokenizer_path   optional; for samplers with `needs_decode` (loaded once per path per process)
    sampler_modules  optional list of modules to import so the spec kinds are registered server-side

Per step, for each row that carries `sampler_specs`: catch up (`chain.on_token` for every output token
the chain has not seen yet, with a view that excludes that token, recording the annotations), then
`chain.adjust` and write the result into the row; a forced token (or a finish, which forces EOS) turns
the row into a one-hot mask (0 at the token, -inf elsewhere). Rows without our params pass through.

Annotations: `annotations_for(rid, output_ids)` returns what the processor recorded (caught up to the
final output ids, since the processor is not called after the last token). A client in another process
cannot read this registry; it calls `sampler.replay_annotations(...)` on the returned ids instead, which
gives the same list (tests check that they agree).

Host requirements and limits:
- run SGLang with `--disable-overlap-schedule` (the launcher adds it): with the overlap scheduler the
  previous step's token is appended to `req.output_ids` only after the next step's sampler ran, so the
  chain would see every step one token late;
- speculative decoding (several rows of one request in one call) is rejected;
- multi-model samplers (`needs_partner`, Tandem) need the two-model server (`tandem_model`): the request
  then carries `partner_vocab` = V, each logits row is `[senior | junior - offset]` (width 2V), the
  processor hands the sampler both halves and writes the chosen one into the first V columns with the
  rest masked; without `partner_vocab` such samplers are rejected with their name;
- the logprobs SGLang returns are taken after this processor: a forced token has logprob 0 there.
"""

from __future__ import annotations

import json
import math
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence

import torch

try:
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
except ImportError as exc:  # pragma: no cover - exercised only without sglang
    raise ImportError(
        "sglang_patches.sglang_adapter hosts samplers inside SGLang and needs the `sglang` package "
        f"(sglang.srt.sampling.custom_logit_processor could not be imported: {exc}). Install sglang, or "
        "on CPU machines run scripts/install_sglang_cpu.sh."
    ) from exc

from sglang_patches.request_sampler import SAMPLER_REGISTRY, RequestView, SamplerChain, import_sampler_modules
from sglang_patches.tandem_model import split_logits

# custom_params keys
SPECS_KEY = "sampler_specs"
SEED_KEY = "seed"
EOS_KEY = "eos_token_id"
RID_KEY = "rid"
TOKENIZER_KEY = "tokenizer_path"
MODULES_KEY = "sampler_modules"
PARTNER_VOCAB_KEY = "partner_vocab"  # set when the server is the two-model tandem engine
REQ_KEY = "__req__"  # injected by SGLang

MAX_TRACKED_REQUESTS = 65536  # bound on tracked requests (finished ones are evicted first, then the oldest)
SWEEP_EVERY = 1024  # processor calls between sweeps that drop requests whose Req was freed


class SamplerHostError(RuntimeError):
    """A request's samplers cannot be hosted by this SGLang server (named in the message)."""


# -- building the request side -------------------------------------------------------------------
def encode_specs(specs: Sequence[dict[str, Any]]) -> str:
    return json.dumps(list(specs), sort_keys=True, separators=(",", ":"))


def decode_specs(value: Any) -> list[dict[str, Any]]:
    specs = json.loads(value) if isinstance(value, str) else value
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise SamplerHostError(f"custom param {SPECS_KEY!r} must be a JSON list of sampler specs, got {value!r}")
    return specs


def sampler_modules(specs: Sequence[dict[str, Any]]) -> list[str]:
    """Modules defining the spec kinds (so a server process can import and register them)."""
    mods = []
    for spec in specs:
        cls = SAMPLER_REGISTRY.get(spec.get("kind"))
        if cls is not None and cls.__module__ not in ("__main__", "sglang_patches.request_sampler") and cls.__module__ not in mods:
            mods.append(cls.__module__)
    return mods


def build_custom_params(
    specs: Sequence[dict[str, Any]], seed: int, eos_token_id: int, rid: str,
    tokenizer_path: Optional[str] = None, partner_vocab: Optional[int] = None,
) -> dict[str, Any]:
    """`sampling_params["custom_params"]` for a request whose samplers run in SGLang (JSON-safe values)."""
    params: dict[str, Any] = {
        SPECS_KEY: encode_specs(specs), SEED_KEY: int(seed), EOS_KEY: int(eos_token_id), RID_KEY: str(rid),
    }
    mods = sampler_modules(specs)
    if mods:
        params[MODULES_KEY] = mods
    if tokenizer_path:
        params[TOKENIZER_KEY] = str(tokenizer_path)
    if partner_vocab is not None:
        params[PARTNER_VOCAB_KEY] = int(partner_vocab)
    return params


def check_hostable(specs: Sequence[dict[str, Any]], seed: int = 0, partner: bool = False) -> SamplerChain:
    """Build the chain as the server would and reject what the server cannot host (a partner sampler
    on a single-model server)."""
    chain = SamplerChain.from_specs(specs, seed)
    partners = [s.kind for s in chain.samplers if s.needs_partner]
    if partners and not partner:
        raise SamplerHostError(
            f"sampler(s) {partners} need a partner model (needs_partner), which a single-model SGLang server "
            "does not have; serve the pair with sglang_patches.tandem_model (client partner_vocab=V) or use "
            "the embedded engine"
        )
    return chain


# -- tokenizers (for samplers that decode text) ---------------------------------------------------
@lru_cache(maxsize=8)
def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def decoder_for(path: str) -> Callable[[Sequence[int]], str]:
    """`decode(ids)` for the HF tokenizer at `path` (loaded once per path per process)."""
    tok = _load_tokenizer(str(path))
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


# -- per-request state ----------------------------------------------------------------------------
@dataclass
class _RequestState:
    chain: SamplerChain
    specs_key: str
    view_rid: str
    seed: int
    eos_token_id: int
    prompt_ids: Sequence[int]
    decode: Optional[Callable[[Sequence[int]], str]]
    req_ref: Any  # weakref to the live Req (or None)
    req_id: int
    output_ids: list[int] = field(default_factory=list)  # tokens the chain has consumed
    annotations: list[dict[str, Any]] = field(default_factory=list)
    finish_requested: bool = False

    def live_req(self) -> Any:
        return self.req_ref() if self.req_ref is not None else None

    def done(self) -> bool:
        req = self.live_req()
        if req is None:
            return self.req_ref is not None  # the Req was freed
        finished = getattr(req, "finished", None)
        return bool(finished()) if callable(finished) else False

    def catch_up(self, output_ids: Sequence[int]) -> None:
        for token in output_ids[len(self.output_ids):]:
            view = RequestView(self.view_rid, self.seed, self.prompt_ids, self.output_ids, self.eos_token_id, self.decode)
            self.annotations.append(self.chain.on_token(int(token), view))
            self.output_ids.append(int(token))


_REGISTRY: "OrderedDict[str, _RequestState]" = OrderedDict()
_LOCK = threading.RLock()
_CALLS = 0


def _weak(obj: Any) -> Any:
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj  # not weak-referenceable: hold it (evicted by the registry bound)


def _evict_locked(limit: int) -> None:
    if len(_REGISTRY) <= limit:
        return
    for key in [k for k, st in _REGISTRY.items() if st.done()]:
        del _REGISTRY[key]
        if len(_REGISTRY) <= limit:
            return
    while len(_REGISTRY) > limit:
        _REGISTRY.popitem(last=False)


def _prompt_of(req: Any) -> Sequence[int]:
    ids = getattr(req, "origin_input_ids", None)
    return [] if ids is None else ids  # by reference: no copy of long prompts per request


def _sweep_locked() -> None:
    """Drop requests whose Req object is gone (it can never call again; replay recovers annotations)."""
    for key in [k for k, st in _REGISTRY.items() if st.req_ref is not None and st.live_req() is None]:
        del _REGISTRY[key]


def _ensure_registered(specs: Sequence[dict[str, Any]], modules: Any) -> None:
    """Import the sampler modules the request names when a kind is not registered yet (only modules a
    registered method declares: `import_sampler_modules`)."""
    missing = [s.get("kind") for s in specs if s.get("kind") not in SAMPLER_REGISTRY]
    if missing and modules:
        try:
            import_sampler_modules(modules)
        except ValueError as exc:
            raise SamplerHostError(f"custom param {MODULES_KEY!r}: {exc}") from None


def _state_for(params: dict[str, Any], req: Any) -> _RequestState:
    key = str(getattr(req, "rid", None) or params.get(RID_KEY) or "")
    if not key:
        raise SamplerHostError("a request with sampler specs has neither a live Req rid nor a 'rid' custom param")
    specs_raw = params[SPECS_KEY]
    specs_key = specs_raw if isinstance(specs_raw, str) else encode_specs(specs_raw)
    state = _REGISTRY.get(key)
    if state is not None:
        same_req = state.req_id == id(req) and (state.live_req() is req)
        n = len(state.output_ids)
        consistent = len(req.output_ids) >= n and (n == 0 or int(req.output_ids[n - 1]) == state.output_ids[-1])
        if same_req and consistent and state.specs_key == specs_key:
            _REGISTRY.move_to_end(key)
            return state
    # new request (or a new Req under a reused rid, or a retraction that rewound it): start over
    specs = decode_specs(specs_raw)
    _ensure_registered(specs, params.get(MODULES_KEY))
    seed = int(params.get(SEED_KEY, 0))
    chain = check_hostable(specs, seed, partner=PARTNER_VOCAB_KEY in params)
    decode = None
    if chain.needs_decode:
        path = params.get(TOKENIZER_KEY)
        if not path:
            needing = [s.kind for s in chain.samplers if s.needs_decode]
            raise SamplerHostError(f"sampler(s) {needing} decode text: pass {TOKENIZER_KEY!r} in custom_params")
        decode = decoder_for(str(path))
    if EOS_KEY not in params:
        raise SamplerHostError(f"request {key!r}: custom_params lack {EOS_KEY!r}")
    state = _RequestState(
        chain=chain, specs_key=specs_key, view_rid=str(params.get(RID_KEY) or key), seed=seed,
        eos_token_id=int(params[EOS_KEY]), prompt_ids=_prompt_of(req),
        decode=decode, req_ref=_weak(req), req_id=id(req),
    )
    _REGISTRY[key] = state
    _evict_locked(MAX_TRACKED_REQUESTS)
    return state


def annotations_for(rid: str, output_ids: Optional[Sequence[int]] = None) -> Optional[list[dict[str, Any]]]:
    """Per-token annotations recorded for `rid` in this process (None if unknown or evicted).

    The processor runs before each token is chosen, so the last token is consumed only here: pass the
    final output ids (or leave them out while the Req is alive: its `output_ids` are used).
    """
    with _LOCK:
        state = _REGISTRY.get(rid)
        if state is None:
            return None
        if output_ids is None:
            req = state.live_req()
            output_ids = list(req.output_ids) if req is not None else state.output_ids
        if list(output_ids[: len(state.output_ids)]) != state.output_ids:
            raise ValueError(f"request {rid!r}: output ids differ from the ones its samplers consumed")
        state.catch_up(output_ids)
        return [dict(a) for a in state.annotations[: len(output_ids)]]


def finish_requested(rid: str) -> Optional[bool]:
    """Whether a sampler of `rid` ended it (forced EOS via `finish`); None if unknown."""
    with _LOCK:
        state = _REGISTRY.get(rid)
        return None if state is None else state.finish_requested


def release(rid: str) -> bool:
    """Forget `rid`'s sampler state. Returns whether it was tracked."""
    with _LOCK:
        return _REGISTRY.pop(rid, None) is not None


def tracked_requests() -> list[str]:
    with _LOCK:
        return list(_REGISTRY)


def clear_registry() -> None:
    with _LOCK:
        _REGISTRY.clear()


# -- the processor --------------------------------------------------------------------------------
class SamplerLogitProcessor(CustomLogitProcessor):
    """Runs each row's SamplerChain (see the module docstring). Stateless itself: SGLang rebuilds it
    per batch from `to_str()`; the state lives in the module registry."""

    def __call__(self, logits: torch.Tensor, custom_param_list: Optional[list[Optional[dict[str, Any]]]] = None) -> torch.Tensor:
        if not custom_param_list:
            return logits
        if len(custom_param_list) != logits.shape[0]:
            raise ValueError(f"{len(custom_param_list)} custom param dicts for {logits.shape[0]} logits rows")
        global _CALLS
        seen: set[int] = set()
        with _LOCK:
            _CALLS += 1
            if _CALLS % SWEEP_EVERY == 0:
                _sweep_locked()
            for i, params in enumerate(custom_param_list):
                if not params:
                    continue
                vocab = params.get(PARTNER_VOCAB_KEY)
                if SPECS_KEY not in params:
                    if vocab is not None:  # a solo request on the tandem server: the senior's half only
                        logits[i, int(vocab):] = -math.inf
                    continue
                req = params.get(REQ_KEY)
                if req is None:
                    raise SamplerHostError(f"row {i}: sampler specs without the live request ({REQ_KEY!r})")
                if id(req) in seen:
                    raise SamplerHostError(
                        f"request {getattr(req, 'rid', '?')!r} has several logits rows in one call (speculative "
                        "decoding); per-request samplers need one row per step: disable speculative decoding")
                seen.add(id(req))
                state = _state_for(params, req)
                state.catch_up(req.output_ids)
                row, partner = logits[i], None
                if vocab is not None:
                    row, partner = split_logits(logits[i], int(vocab))
                view = RequestView(state.view_rid, state.seed, state.prompt_ids, state.output_ids,
                                   state.eos_token_id, state.decode)
                action = state.chain.adjust(row, partner, view)
                width = row.shape[-1]
                if action.force_token is not None:
                    forced = torch.full_like(logits[i], -math.inf)
                    forced[int(action.force_token)] = 0.0
                    logits[i] = forced
                    state.finish_requested = state.finish_requested or action.finish
                elif action.logits is not None and (action.logits is not row or partner is not None):
                    logits[i, :width] = action.logits.to(device=logits.device, dtype=logits.dtype)
                if partner is not None:
                    logits[i, width:] = -math.inf
        return logits
