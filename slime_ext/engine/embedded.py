"""The embedded engine: batched generation with a KV cache over an HF causal LM, in-process.

It is the CPU host of the rollout side (SGLang is the GPU host); both run the same samplers.

One `generate` call decodes a static batch:
1. requests with identical input ids are prefilled once (a group of n samples of one prompt computes
   the prompt once; the static-KV kernel also holds the prompt's KV once for the n rows, the HF path copies
   it into each row) and every input reuses the longest cached prefix (`PrefixCache`), so a
   continuation (prompt + partial response + appended text) prefills only the new tokens;
2. all rows share one left-padded DynamicCache; prefix KV of different lengths and their new tokens are
   laid out with padding holes that the attention mask hides, and positions count real tokens only;
3. each step every row's samplers adjust its logits, the token is chosen with the row's own generator
   (seeded from the request seed, so batching never changes a request's draws), annotated, and checked
   for stop; finished or aborted rows leave the batch (their cache rows are dropped) so the rest do
   not pay for them;
4. a partner model (Tandem's junior) runs in lockstep on the same tokens with its own cache, and its
   logits are handed to the samplers;
5. when a request asks for routed experts (`return_routed_experts`, rollout routing replay), forward hooks
   on the policy's MoE routers record every fed token's top-k expert ids per MoE layer for the duration of
   the call (no hooks, no cost otherwise). Prefix-cache entries written by such a call carry their tokens'
   routing next to their KV, and recording calls only reuse prefixes that have it (docs/routing-replay.md);
6. servers batch continuously (`admit`): requests that arrive during a call are prefilled between two decode
   steps and their rows appended to the running batch (static-KV kernel), and each result is handed over as
   its row finishes (`on_finish`), so a short request never waits for the longest one of its batch.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Optional, Sequence

import torch
from transformers import DynamicCache

from sglang_patches.request_sampler import FINISH_SAMPLER, RequestView, SamplerChain
from sglang_patches.decoding import FINISH_ABORT, StopChecker, choose_tokens
from slime_ext.data.generation import GenerateRequest, GenerateResult, check_unique_rids
from slime_ext.engine import static_kv
from slime_ext.engine.lora_merge import MergedLoRA
from slime_ext.engine.prefix_cache import KV, PrefixCache

# auto: the static-KV forward (slime_ext/engine/static_kv.py) where it models the architecture, else HF;
# static: that forward or an error; hf: transformers' forward with a DynamicCache (the reference)
KERNELS = ("auto", "static", "hf")


PREFIX_CACHE_TOKENS = 1 << 20  # the prefix cache's token budget (blocks held, each token once)
SCORE_BATCH = 64  # sequences per prefill-only scoring forward (a padded batch)

# continuous batching: called with a `can_join(request)` test, returns the requests that join the running batch
Admit = Callable[[Callable[[GenerateRequest], bool]], list[GenerateRequest]]


@dataclass
class _Row:
    request: GenerateRequest
    chain: SamplerChain
    stop: StopChecker
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    annotations: list[dict[str, Any]] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: Optional[str] = None
    routing: list[torch.Tensor] = field(default_factory=list)  # recorded chunks, each [n, moe_layers, top_k]


def _row_kv(cache: DynamicCache, row: int, valid: torch.Tensor, start: int = 0) -> KV:
    """One row's KV without padding holes, from its `start`-th fed token on: per layer ([heads, n - start, dim]
    twice), copied (the prefix cache asks only for the part past the prefix it already holds)."""
    idx = valid.nonzero().squeeze(-1)[start:].to(cache.layers[0].keys.device)
    return [(layer.keys[row][:, idx].clone(), layer.values[row][:, idx].clone()) for layer in cache.layers]


def _is_moe_router(module: torch.nn.Module) -> bool:
    """transformers' top-k MoE router (Qwen3MoeTopKRouter and its relatives): forward returns
    (router_logits, top-k weights, top-k expert ids [tokens, top_k])."""
    return type(module).__name__.endswith("TopKRouter") and hasattr(module, "top_k")


class RoutingRecorder:
    """Records the top-k expert ids of every MoE router of a model, per forward, with forward hooks.

    The hooks are registered only inside `with recorder:` (a generate call that has a request asking for
    routed experts), so an engine that nobody asks pays nothing. `take()` returns the last forward's routing
    as an int16 tensor [batch * seq, moe_layers, top_k] in the model's token order (batch-major), layers in
    model order.
    """

    def __init__(self, model: torch.nn.Module):
        self.routers = [m for m in model.modules() if _is_moe_router(m)]
        if not self.routers:
            raise ValueError("routed experts were requested but the engine's model has no MoE router")
        self.top_k = int(self.routers[0].top_k)
        self._captured: list[Optional[torch.Tensor]] = [None] * len(self.routers)
        self._handles: list[Any] = []

    def __enter__(self) -> "RoutingRecorder":
        for i, router in enumerate(self.routers):
            self._handles.append(router.register_forward_hook(self._hook(i)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._captured = [None] * len(self.routers)

    def _hook(self, layer: int) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            self._captured[layer] = output[2]
        return hook

    def take(self) -> torch.Tensor:
        if any(c is None for c in self._captured):
            raise RuntimeError("a MoE router did not run in the last forward")
        out = torch.stack([c.to("cpu", torch.int16) for c in self._captured], dim=1)
        self._captured = [None] * len(self.routers)
        return out


class _ModelState:
    """One model's batched KV cache during a generate call. Bookkeeping (masks, tokens) stays on the CPU;
    inputs move to the model's device per call and last-position logits stay there: sampling runs on the
    device (only rows with samplers bring their logits to the host), so a GPU step moves ids, not [B, V]."""

    def __init__(self, model: torch.nn.Module, store: PrefixCache, recorder: Optional[RoutingRecorder] = None):
        self.model = model
        self.store = store
        self.recorder = recorder
        self.cache: Optional[DynamicCache] = None
        self.device = next(model.parameters()).device
        self.prefill_routing: list[torch.Tensor] = []  # per input [len(ids), moe_layers, top_k] (with a recorder)
        self.step_routing: Optional[torch.Tensor] = None  # per row [B, moe_layers, top_k] (with a recorder)
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # [rows, slots]: 1 where a fed token's KV sits

    def prefix_length(self, ids: list[int], max_len: int) -> int:
        return self.store.prefix_length(ids, max_len, with_routing=self.recorder is not None)

    @torch.no_grad()
    def prefill(self, inputs: list[list[int]], limits: Optional[list[int]] = None) -> tuple[torch.Tensor, list[int]]:
        """Prefill unique inputs (reusing cached prefixes, at most `limits[i]` tokens of input i, so that
        models in lockstep reuse the same lengths). Returns last-position logits [U, V] and the number of
        cached tokens used per input."""
        caps = limits if limits is not None else [len(ids) - 1 for ids in inputs]
        routed: list[Optional[torch.Tensor]] = [None] * len(inputs)
        if self.recorder is not None:  # only prefixes whose routing is known (stored with their KV)
            found = [self.store.longest_prefix_routed(ids, max_len=min(len(ids) - 1, cap)) for ids, cap in zip(inputs, caps)]
            prefixes = [(p, kv) for p, kv, _ in found]
            routed = [r for _, _, r in found]
        else:
            prefixes = [self.store.longest_prefix(ids, max_len=min(len(ids) - 1, cap)) for ids, cap in zip(inputs, caps)]
        p_max = max(p for p, _ in prefixes)
        rest = [ids[p:] for ids, (p, _) in zip(inputs, prefixes)]
        r_max = max(len(r) for r in rest)
        n = len(inputs)
        mask = torch.zeros(n, p_max + r_max, dtype=torch.long)
        tokens = torch.zeros(n, r_max, dtype=torch.long)
        cache = DynamicCache()
        if p_max:
            layers = len(next(kv for p, kv in prefixes if kv is not None))
            ref_k, ref_v = next(kv for p, kv in prefixes if kv is not None)[0]
            for layer in range(layers):
                ks, vs = [], []
                for p, kv in prefixes:
                    k = torch.zeros(ref_k.shape[0], p_max, ref_k.shape[2], dtype=ref_k.dtype, device=ref_k.device)
                    v = torch.zeros(ref_v.shape[0], p_max, ref_v.shape[2], dtype=ref_v.dtype, device=ref_v.device)
                    if p:
                        k[:, p_max - p :] = kv[layer][0]
                        v[:, p_max - p :] = kv[layer][1]
                    ks.append(k)
                    vs.append(v)
                cache.update(torch.stack(ks), torch.stack(vs), layer)
        for i, ((p, _), r) in enumerate(zip(prefixes, rest)):
            mask[i, p_max - p : p_max] = 1
            mask[i, p_max + r_max - len(r) :] = 1
            tokens[i, r_max - len(r) :] = torch.tensor(r, dtype=torch.long)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, p_max:]
        dev = self.device
        out = self.model(input_ids=tokens.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                         past_key_values=cache, use_cache=True, logits_to_keep=1,
                         cache_position=torch.arange(p_max, p_max + r_max, device=dev))
        self.cache = out.past_key_values
        self.prefill_routing = []
        if self.recorder is not None:
            new = self.recorder.take().view(n, r_max, -1, self.recorder.top_k)
            for i, ((p, _), r) in enumerate(zip(prefixes, rest)):
                parts = ([routed[i]] if p else []) + [new[i, r_max - len(r):]]
                self.prefill_routing.append(torch.cat(parts) if len(parts) > 1 else parts[0].clone())
        self.mask = mask
        for i, ids in enumerate(inputs):
            self.store.insert_from(ids, partial(self.row_kv, i),
                                   self.prefill_routing[i] if self.recorder is not None else None)
        return out.logits[:, -1].float(), [p for p, _ in prefixes]

    def row_kv(self, row: int, start: int = 0) -> KV:
        return _row_kv(self.cache, row, self.mask[row].bool(), start)

    def fed(self, row: int) -> int:
        return int(self.mask[row].sum())

    def select(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index.to(self.device))
        self.mask = self.mask[index]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = mask = torch.cat([self.mask, torch.ones(len(tokens), 1, dtype=self.mask.dtype)], dim=1)
        positions = (mask.sum(-1, keepdim=True) - 1)
        length = mask.shape[1]
        dev = self.device
        out = self.model(input_ids=tokens[:, None].to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1,
                         cache_position=torch.arange(length - 1, length, device=dev))
        self.cache = out.past_key_values
        if self.recorder is not None:
            self.step_routing = self.recorder.take()
        return out.logits[:, -1].float()


MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")  # SGLang's GPU_MEMORY_ALL_TYPES


def _memory_tags(tags: Optional[Sequence[str]]) -> set[str]:
    """SGLang's tags of a release / resume (none: all), unknown ones refused."""
    chosen = set(tags or MEMORY_TAGS)
    unknown = sorted(chosen - set(MEMORY_TAGS))
    if unknown:
        raise ValueError(f"unknown memory tags {unknown} (SGLang's are {list(MEMORY_TAGS)})")
    return chosen


class EmbeddedEngine:
    """In-process rollout engine over an HF causal LM (and optionally a partner model)."""

    accepts_admission = True  # `generate(..., admit=, on_finish=)`: continuous batching (servers use it)

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_id: int,
        partner: Optional[torch.nn.Module] = None,
        decode: Optional[Callable[[Sequence[int]], str]] = None,
        prefix_cache_tokens: int = PREFIX_CACHE_TOKENS,
        kernel: str = "auto",
    ):
        if kernel not in KERNELS:
            raise ValueError(f"engine kernel must be one of {KERNELS}, got {kernel!r}")
        if kernel == "static":
            for name, m in (("model", model), ("partner", partner)):
                reason = static_kv.unsupported_reason(m) if m is not None else None
                if reason is not None:
                    raise ValueError(f"engine kernel 'static' cannot run the {name}: {reason} (use 'auto' or 'hf')")
        self.kernel = kernel
        self.model = model.eval()
        self.partner = partner.eval() if partner is not None else None
        self.lora = MergedLoRA()  # the LoRA adapter served (merged), if any
        self.eos_token_id = int(eos_token_id)
        self.decode = decode
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.partner_prefix_cache = PrefixCache(prefix_cache_tokens)
        self._aborted: set[str] = set()
        self._cache_epoch = 0  # bumped by every flush: KV computed before a weight update is never cached after it
        self._lock = threading.Lock()
        self._on_token: Optional[Callable[[str, int], None]] = None
        self.stats = {"requests": 0, "generated_tokens": 0, "prefill_tokens": 0, "cached_tokens": 0,
                      "decode_seconds": 0.0, "aborted": 0}
        self.released: set[str] = set()  # memory tags released (release_memory_occupation)
        self._released_shapes: dict[str, torch.Size] = {}

    @classmethod
    def from_pretrained(cls, path: str, partner_path: Optional[str] = None, dtype: torch.dtype = torch.float32,
                        **kwargs: Any) -> "EmbeddedEngine":
        from transformers import AutoModelForCausalLM

        from slime_ext.tokenizer import load_tokenizer

        tok = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        partner = AutoModelForCausalLM.from_pretrained(partner_path, dtype=dtype) if partner_path else None
        return cls(model, tok.eos_token_id, partner=partner,
                   decode=lambda ids: tok.decode(ids, skip_special_tokens=False), **kwargs)

    # -- control ----------------------------------------------------------------------------------
    def abort(self, rid: str) -> None:
        """Stop request `rid` at its next step (thread-safe; call while `generate` runs)."""
        with self._lock:
            self._aborted.add(rid)

    def flush_cache(self) -> None:
        self._cache_epoch += 1
        self.prefix_cache.clear()
        self.partner_prefix_cache.clear()

    def release_memory_occupation(self, tags: Optional[Sequence[str]] = None) -> int:
        """SGLang's release (tags: "weights", "kv_cache", "cuda_graph"; none: all). The policy's parameters are
        freed for real (their storage emptied, the heap trimmed), so the process's memory falls; the KV state is
        the prefix caches. The partner stays: no sync restores it. Returns the parameter bytes freed."""
        tags = _memory_tags(tags)
        freed = 0
        if "kv_cache" in tags:
            self.flush_cache()
            self.released.add("kv_cache")
        if "weights" in tags and "weights" not in self.released:
            self._released_shapes = {}
            for name, p in self.model.named_parameters():
                self._released_shapes[name] = p.shape
                freed += p.numel() * p.element_size()
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            self.released.add("weights")
        self.released |= tags & {"cuda_graph"}
        import gc

        from slime_ext.engine.weight_sync import return_freed_memory

        gc.collect()
        return_freed_memory()  # freed pages back to the OS: what the process holds falls now
        return freed

    def resume_memory_occupation(self, tags: Optional[Sequence[str]] = None) -> None:
        """SGLang's resume. Weights come back zeroed, as SGLang's memory saver gives back memory without its
        contents: the sync that follows fills them (checked by the weight checker)."""
        tags = _memory_tags(tags)
        if "weights" in tags and "weights" in self.released:
            for name, p in self.model.named_parameters():
                p.data = torch.zeros(self._released_shapes[name], dtype=p.dtype, device=p.device)
        self.released -= tags

    def memory_released(self) -> Optional[str]:
        """Why this engine cannot generate now (its weights are released), or None."""
        if "weights" in self.released:
            return ("the engine's weights are released (release_memory_occupation): resume_memory_occupation and a "
                    "weight sync come first")
        return None

    def metrics(self) -> dict[str, float]:
        out = dict(self.stats)
        out["decode_tokens_per_s"] = out["generated_tokens"] / max(out["decode_seconds"], 1e-9)
        out["prefix_cache_hit_rate"] = out["cached_tokens"] / max(out["cached_tokens"] + out["prefill_tokens"], 1)
        return out

    def parameter(self, name: str) -> torch.Tensor:
        """The policy's tensor (or expert slice) an HF name refers to; KeyError when none does."""
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        try:
            target, rows = _resolve_target(name, params)
        except (ValueError, IndexError):
            target = None
        if target is None:
            raise KeyError(f"weight update: {name!r} matches no parameter of the engine's model")
        return target if rows is None else target[rows]

    def check_weight_update(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(destination, new value) for every tensor; raises before anything is copied (KeyError for an
        unknown name, ValueError for a shape mismatch), so a bad update leaves the weights as they were."""
        pairs = []
        for name, tensor in named_tensors:
            dst = self.parameter(name)
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ValueError(f"weight update: {name!r} has shape {tuple(tensor.shape)}, model expects {tuple(dst.shape)}")
            pairs.append((dst, tensor))
        return pairs

    def load_lora_adapter(self, name: str, config: dict, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """SGLang's /load_lora_adapter_from_tensors: the adapter merged into the policy (slime_ext/engine/lora_merge.py);
        requests then name it. Returns the modules it sets."""
        return self.lora.load(self, name, config, named_tensors)

    def unload_lora_adapter(self, name: str) -> None:
        self.lora.unload(self, name)

    @torch.no_grad()
    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy canonical HF-named tensors (megatron_glue's export format) into the policy in place.

        transformers keeps Qwen3-MoE experts fused (`experts.gate_up_proj` [E, 2I, H], gate rows first;
        `experts.down_proj` [E, H, I]); per-expert names are written into their slices. Everything is
        checked first (all or nothing). The prefix cache is flushed: its KV was computed with the old weights.
        """
        for dst, tensor in self.check_weight_update(named_tensors):
            dst.copy_(tensor.to(dst.dtype))
        self.flush_cache()

    @torch.no_grad()
    def apply_weight_payload(self, payload: list[tuple[str, torch.Tensor]]) -> int:
        """One checksummed bucket (`sglang_patches.weight_payload`: dense or sparse entries) written into the
        policy and verified; returns the tensors verified. A bad name or shape raises before anything is
        written; a failed checksum raises ChecksumMismatch (the sync stops the run)."""
        from sglang_patches import weight_payload

        weight_payload.check_payload(payload, self.parameter)
        try:
            return weight_payload.apply_payload(payload, self.parameter)
        finally:
            self.flush_cache()

    @torch.no_grad()
    def score(self, sequences: list[list[int]], starts: list[int], model: str = "partner") -> list[list[float]]:
        """Prefill-only scoring (SGLang's /generate with max_new_tokens 0, return_logprob, logprob_start_len):
        the logprob at temperature 1 of every token of `sequences[i]` from position `starts[i]` on, under the
        partner model (on-policy distillation's teacher) or the policy ("policy")."""
        net = self.partner if model == "partner" else self.model if model == "policy" else None
        if net is None:
            raise ValueError(f"score: model {model!r} is not held by this engine (partner: "
                             f"{'loaded' if self.partner is not None else 'none'}; 'policy' always)")
        for ids, start in zip(sequences, starts):
            if not 1 <= start <= len(ids):
                raise ValueError(f"score: start {start} outside 1..{len(ids)} for a sequence of {len(ids)} tokens")
        out: list[list[float]] = [[] for _ in sequences]
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # similar lengths share a batch
        for first in range(0, len(order), SCORE_BATCH):
            chunk = order[first:first + SCORE_BATCH]
            width = max(len(sequences[i]) for i in chunk)
            # right padding: causal attention and per-token routing leave every real position's logits as alone
            x = torch.tensor([sequences[i] + [0] * (width - len(sequences[i])) for i in chunk], dtype=torch.long)
            logprobs = torch.log_softmax(net(input_ids=x).logits[:, :-1].float(), dim=-1)  # row t predicts t + 1
            picked = logprobs.gather(-1, x[:, 1:, None])[..., 0]
            for row, i in enumerate(chunk):
                out[i] = picked[row, starts[i] - 1:len(sequences[i]) - 1].tolist()
        return out

    # -- generation -------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, requests: list[GenerateRequest],
                 on_token: Optional[Callable[[str, int], None]] = None,
                 admit: Optional[Admit] = None,
                 on_finish: Optional[Callable[[GenerateResult], None]] = None) -> list[GenerateResult]:
        """Generate all requests as one batch. `on_token(rid, token_id)` is called for every emitted token
        as it is chosen (streaming servers use it).

        Continuous batching (servers): with `admit`, requests join the running batch between decode steps, so
        a request arriving mid-call does not wait for the whole batch. `admit(can_join)` is called before
        every step and returns the requests to add now, only ones `can_join` accepts (the batch's models and
        routing recording are fixed when it starts; the static-KV kernel is needed to merge rows). With
        `on_finish(result)`, each request's result is handed over as soon as it finishes. Returns every
        result: the initial requests', then the admitted ones' in admission order."""
        asleep = self.memory_released()
        if asleep:
            raise RuntimeError(asleep)
        self._on_token = on_token
        if not requests:
            return []
        check_unique_rids(requests)
        self.lora.check_requests(requests)
        rows = [self._new_row(r) for r in requests]
        if any(row.chain.needs_partner for row in rows) and self.partner is None:
            raise ValueError("a sampler needs a partner model but the engine has none")
        recorder = RoutingRecorder(self.model) if any(r.return_routed_experts for r in requests) else None
        models = [(self.model, self.prefix_cache, recorder)]
        if self.partner is not None and any(row.chain.needs_partner for row in rows):
            models.append((self.partner, self.partner_prefix_cache, None))
        try:
            if recorder is None:
                self._decode_batch(rows, models, admit, on_finish)
            else:
                with recorder:
                    self._decode_batch(rows, models, admit, on_finish)
        finally:
            with self._lock:
                self._aborted.difference_update(row.request.rid for row in rows)
        self.stats["requests"] += len(rows)
        return [self._result(row) for row in rows]

    def _state(self, model: torch.nn.Module, store: PrefixCache, recorder: Optional[RoutingRecorder]) -> Any:
        """The per-call batch state: the static-KV forward where it models `model` (kernel auto/static),
        else transformers' forward with a DynamicCache."""
        if self.kernel != "hf" and static_kv.supports(model):
            return static_kv.StaticKVState(model, store, record=recorder is not None)
        return _ModelState(model, store, recorder)

    def _start_rows(self, rows: list[_Row], states: list[Any]) -> list[torch.Tensor]:
        """Prefill the rows' inputs into fresh `states` (each unique input once) and expand them to one
        logical row per request; returns each model's next-token logits, one row per request."""
        record = states[0].recorder is not None
        unique: dict[tuple[int, ...], int] = {}
        for row in rows:
            unique.setdefault(tuple(row.request.input_ids), len(unique))
        inputs = [list(k) for k in unique]
        logits_list, cached = [], None
        # every model reuses the same prefix length (the shortest any of their caches holds): the partner's
        # cache may lack prefixes the policy cached while serving requests without a partner
        limits = [min(st.prefix_length(ids, len(ids) - 1) for st in states) for ids in inputs] \
            if len(states) > 1 else None
        for state in states:
            logits, used = state.prefill(inputs, limits)
            logits_list.append(logits)
            if cached is None:
                cached = used
        expand = torch.tensor([unique[tuple(row.request.input_ids)] for row in rows])
        for state in states:  # one row per request (static-KV rows share their prompt's KV; HF rows copy it)
            state.select(expand)
        for row, u in zip(rows, expand.tolist()):
            row.cached_tokens = cached[u]
            if record:
                row.routing = [states[0].prefill_routing[u]]
        self.stats["cached_tokens"] += sum(cached)
        self.stats["prefill_tokens"] += sum(len(i) - c for i, c in zip(inputs, cached))
        return [lg[expand] for lg in logits_list]

    def _decode_batch(self, rows: list[_Row], models: list[tuple], admit: Optional[Admit],
                      on_finish: Optional[Callable[[GenerateResult], None]]) -> None:
        """Prefill and decode `rows` to the end; rows leave as they finish and, with `admit`, new ones join
        (`rows` grows in place)."""
        states = [self._state(*m) for m in models]
        record = states[0].recorder is not None
        epoch = self._cache_epoch  # a call that goes on across a weight update (in-place pause) holds mixed KV
        logits_list = self._start_rows(rows, states)
        active = list(range(len(rows)))
        start = time.perf_counter()
        while True:
            if admit is not None:
                states, logits_list = self._admit(admit, rows, active, models, states, logits_list)
            if not active:
                break
            next_tokens = self._decide([rows[i] for i in active], logits_list[0],
                                       logits_list[1] if len(logits_list) > 1 else None)
            self.stats["generated_tokens"] += len(active)
            keep = []
            for b, ri in enumerate(active):
                row = rows[ri]
                if row.finish_reason is None:
                    keep.append(b)
                    continue
                fed = states[0].fed(b)  # keep its KV for continuations (the last token was not fed)
                ids = (row.request.input_ids + row.output_ids)[:fed]
                routing = torch.cat(row.routing)[:fed] if record else None
                for k, state in enumerate(states):
                    if self._cache_epoch == epoch:
                        state.store.insert_from(ids, partial(state.row_kv, b), routing if k == 0 else None)
                if on_finish is not None:
                    with self._lock:  # its rid may be sent again while this call runs
                        self._aborted.discard(row.request.rid)
                    on_finish(self._result(row))
            if not keep:
                active = []  # the states hold finished rows only: an admission starts fresh ones
                continue
            tokens = torch.tensor([next_tokens[b] for b in keep], dtype=torch.long)
            if len(keep) < len(active):
                keep_t = torch.tensor(keep)
                for state in states:
                    state.select(keep_t)
            active = [active[b] for b in keep]
            logits_list = [state.step(tokens) for state in states]
            if record:
                step = states[0].step_routing
                for b, ri in enumerate(active):
                    rows[ri].routing.append(step[b : b + 1])
        self.stats["decode_seconds"] += time.perf_counter() - start

    def _admit(self, admit: Admit, rows: list[_Row], active: list[int], models: list[tuple], states: list[Any],
               logits_list: list[torch.Tensor]) -> tuple[list[Any], list[torch.Tensor]]:
        """Ask `admit` for requests to join; prefill them and append their rows to the running batch."""
        record = states[0].recorder is not None
        mergeable = all(hasattr(st, "merge") for st in states)

        def can_join(request: GenerateRequest) -> bool:
            if not mergeable or (request.return_routed_experts and not record) or request.lora_name != self.lora.name:
                return False
            needs_partner = SamplerChain.from_specs(request.sampler_specs, request.seed).needs_partner
            return len(states) > 1 or not needs_partner

        new = admit(can_join)
        if not new:
            return states, logits_list
        check_unique_rids([rows[i].request for i in active] + list(new))
        new_rows = [self._new_row(r) for r in new]
        fresh = [self._state(*m) for m in models]
        new_logits = self._start_rows(new_rows, fresh)
        if active:
            for state, joining in zip(states, fresh):
                state.merge(joining)
            logits_list = [torch.cat([a, b]) for a, b in zip(logits_list, new_logits)]
        else:
            states, logits_list = fresh, new_logits
        active.extend(range(len(rows), len(rows) + len(new_rows)))
        rows.extend(new_rows)
        return states, logits_list

    def _new_row(self, request: GenerateRequest) -> _Row:
        if not request.input_ids:
            raise ValueError(f"request {request.rid!r} has no input ids")
        generator = torch.Generator().manual_seed(int(request.seed))
        chain = SamplerChain.from_specs(request.sampler_specs, request.seed)
        if chain.needs_decode and self.decode is None:
            raise ValueError(f"request {request.rid!r}: its samplers decode text but the engine has no tokenizer")
        return _Row(request, chain, StopChecker(request.sampling, self.eos_token_id, self.decode), generator)

    def _decide(self, rows: list[_Row], logits: torch.Tensor, partner_logits: Optional[torch.Tensor]) -> list[int]:
        """Choose, annotate and record one token for every active row; mark finished rows."""
        with self._lock:
            aborted = {r.request.rid for r in rows} & self._aborted
        if any(row.chain.samplers for row in rows):  # samplers read and edit logits on the host
            logits = logits.cpu()
            partner_logits = None if partner_logits is None else partner_logits.cpu()
        adjusted = logits
        forced: dict[int, int] = {}
        finishing: set[int] = set()
        views: dict[int, RequestView] = {}
        for b, row in enumerate(rows):
            if not row.chain.samplers:
                continue
            req = row.request
            views[b] = view = RequestView(req.rid, req.seed, req.input_ids, row.output_ids, self.eos_token_id, self.decode)
            action = row.chain.adjust(logits[b], None if partner_logits is None else partner_logits[b], view)
            if action.force_token is not None:
                forced[b] = action.force_token
            elif action.logits is not None:
                if adjusted is logits:
                    adjusted = logits.clone()
                adjusted[b] = action.logits
            if action.finish:
                finishing.add(b)
        sampled = choose_tokens(adjusted, [r.request.sampling for r in rows], [r.generator for r in rows])
        chosen = [forced.get(b, t) for b, t in enumerate(sampled)]
        picked: list[float] = []
        if any(row.request.return_logprob for row in rows):
            chosen_t = torch.tensor(chosen, device=logits.device)[:, None]
            picked = torch.log_softmax(logits, dim=-1).gather(1, chosen_t).squeeze(1).tolist()
        tokens = []
        for b, row in enumerate(rows):
            if row.request.rid in aborted:
                row.finish_reason = FINISH_ABORT
                self.stats["aborted"] += 1
                tokens.append(self.eos_token_id)
                continue
            token = chosen[b]
            row.annotations.append(row.chain.on_token(token, views[b]) if b in views else {})
            if row.request.return_logprob:
                row.logprobs.append(picked[b])
            row.output_ids.append(token)
            if self._on_token is not None:
                self._on_token(row.request.rid, token)
            row.finish_reason = FINISH_SAMPLER if b in finishing else row.stop.check(row.output_ids)
            tokens.append(token)
        return tokens

    def _result(self, row: _Row) -> GenerateResult:
        return GenerateResult(
            rid=row.request.rid,
            output_ids=list(row.output_ids),
            logprobs=list(row.logprobs) if row.request.return_logprob else None,
            finish_reason=row.finish_reason or FINISH_ABORT,
            annotations=row.annotations,
            cached_tokens=row.cached_tokens,
            prompt_len=len(row.request.input_ids),
            routed_experts=self._routed(row) if row.request.return_routed_experts else None,
        )

    @staticmethod
    def _routed(row: _Row) -> torch.Tensor:
        """[prompt_len + len(output) - 1, moe_layers, top_k]: every fed token (the last output token never is)."""
        n = len(row.request.input_ids) + len(row.output_ids) - 1
        routing = torch.cat(row.routing) if len(row.routing) > 1 else row.routing[0]
        if routing.shape[0] < n:
            raise RuntimeError(f"request {row.request.rid!r}: {routing.shape[0]} routed tokens recorded, {n} fed")
        return routing[:n].clone()


def _resolve_target(name: str, params: dict[str, torch.Tensor]) -> tuple[Optional[torch.Tensor], Any]:
    """Map a canonical HF name onto the in-memory model: direct, or a slice of fused expert weights."""
    if name in params:
        return params[name], None
    parts = name.split(".")
    if len(parts) >= 3 and "experts" in parts and parts[-1] == "weight":
        at = parts.index("experts")
        expert, proj = int(parts[at + 1]), parts[at + 2]
        prefix = ".".join(parts[: at + 1])
        if proj in ("gate_proj", "up_proj") and f"{prefix}.gate_up_proj" in params:
            fused = params[f"{prefix}.gate_up_proj"]
            half = fused.shape[1] // 2
            rows = slice(0, half) if proj == "gate_proj" else slice(half, 2 * half)
            return fused[expert], rows
        if proj == "down_proj" and f"{prefix}.down_proj" in params:
            return params[f"{prefix}.down_proj"], expert
    return None, None
