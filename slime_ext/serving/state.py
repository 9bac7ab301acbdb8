"""The engine, tokenizer, template and limits behind the routes, and the checks that need them."""

from __future__ import annotations

import hmac
import itertools
import threading
import uuid
from typing import Any, Optional

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest, GenerateResult
from slime_ext.serving.admission import Admission
from slime_ext.serving.batcher import Batcher
from slime_ext.serving.config import ServeConfig
from slime_ext.serving.errors import APIError, bad_request
from slime_ext.serving.schemas import SEED_MAX, SEED_MIN
from slime_ext.serving.token_bound import (DEFAULT_REQUEST_BYTES, default_request_bytes, max_chars_per_token,
                                           prompt_char_limit)

FINISH_OPENAI = {"stop": "stop", "sampler": "stop", "length": "length", "abort": "abort", "failed": "error"}


class BadRequest(APIError):
    """Kept for callers of the old module: a 400 with an OpenAI error body."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(400, message, param=param)


def engine_context_length(engine: Any) -> Optional[int]:
    """The most positions the engine's model can attend over (None: unbounded, e.g. the exact solver)."""
    explicit = getattr(engine, "max_context_length", None)
    if explicit:
        return int(explicit)
    config = getattr(getattr(engine, "model", None), "config", None)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def engine_vocab_size(engine: Any, tokenizer: Any) -> Optional[int]:
    """Token ids must be below this (an id past the embedding table crashes the forward pass)."""
    config = getattr(getattr(engine, "model", None), "config", None)
    value = getattr(config, "vocab_size", None) or getattr(tokenizer, "vocab_size", None)
    return int(value) if value else None


class ServerState:
    """Everything a route needs; one per server (the routes find it at `app.state.serve`)."""

    def __init__(self, engine: Any, tokenizer: Any, model_name: str, template: str = "plain",
                 max_tokens: int = 256, max_batch: int = 64, config: Optional[ServeConfig] = None, *,
                 model_path: Optional[str] = None, tokenizer_path: Optional[str] = None,
                 weight_version: str = "default"):
        from slime_ext.serving.weights import WeightUpdater
        from slime_ext.tasks.templates import get_template

        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        # SGLang's /model_info identity: a disk update moves model_path and the served name to its path
        self.model_path = model_path if model_path is not None else model_name
        self.tokenizer_path = tokenizer_path if tokenizer_path is not None else self.model_path
        self.template_name = template
        self.template = get_template(template)
        self.max_tokens = int(max_tokens)
        self.config = config or ServeConfig()
        self.context_length = self.config.context_length or engine_context_length(engine)
        self.max_prompt_tokens = self.config.max_prompt_tokens or self.context_length
        self.vocab_size = engine_vocab_size(engine, tokenizer)
        self._extensions: dict[str, Any] = {}  # request extensions built so far (see `extension`)
        # a text longer than max_prompt_chars cannot fit max_prompt_tokens: refused without tokenising it
        self.chars_per_token = max_chars_per_token(tokenizer)
        self.max_prompt_chars = prompt_char_limit(self.max_prompt_tokens, self.chars_per_token)
        # bodies of the prompt routes (OpenAI, /generate): the explicit cap, else enough for a maximal prompt
        explicit = self.config.max_request_bytes
        self.max_request_bytes = explicit if explicit is not None else \
            default_request_bytes(self.max_prompt_tokens, self.chars_per_token)
        # the other routes (weight updates, abort, flush) carry no prompt: the explicit cap, else 4 MiB
        self.max_control_bytes = explicit if explicit is not None else DEFAULT_REQUEST_BYTES
        self.batcher = Batcher(engine, max_batch=max_batch, weight_version=weight_version,
                               window_s=self.config.batch_window_s, settle_s=self.config.batch_settle_s,
                               continuous=self.config.continuous_batching,
                               admit_min_share=self.config.admit_min_share,
                               admit_max_wait_s=self.config.admit_max_wait_s)
        self.weights = WeightUpdater(self)
        self.admission = Admission(self.config.max_concurrency, self.config.max_queue, self.config.queue_timeout_s)
        self._seeds = itertools.count(1)
        self.lock = threading.Lock()
        self.openai_requests = 0  # chat/completion requests served (tests count cloud calls with it)

    @property
    def weight_version(self) -> str:
        """The version of the weights being served (SGLang's `--weight-version`, moved by updates)."""
        return self.batcher.weight_version

    # -- checks -------------------------------------------------------------------------------------
    def authorized(self, header: Optional[str]) -> bool:
        key = self.config.api_key
        if not key:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())

    def check_model(self, name: Optional[str]) -> None:
        if name is None or name == self.model_name or name in self.config.model_aliases:
            return
        raise APIError(404, f"model {name!r} does not exist; this server serves {self.model_name!r}",
                       param="model", code="model_not_found")

    def check_ids(self, ids: Any, param: str) -> list[int]:
        if isinstance(ids, list):
            self.check_prompt_tokens(len(ids))  # by its length, before its ids are looked at
        if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
            raise bad_request(f"'{param}' must be a non-empty list of token ids", param=param)
        bad = [t for t in ids if t < 0 or (self.vocab_size is not None and t >= self.vocab_size)]
        if bad:
            raise bad_request(f"'{param}' has token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}",
                              param=param)
        return ids

    def check_prompt_tokens(self, prompt_len: int) -> None:
        """Refuses prompts over --max-prompt-tokens (the context length by default)."""
        if self.max_prompt_tokens is not None and prompt_len > self.max_prompt_tokens:
            raise bad_request(f"the prompt has {prompt_len} tokens, more than the limit of {self.max_prompt_tokens} "
                              f"prompt tokens (--max-prompt-tokens)", code="context_length_exceeded")

    def token_budget(self, prompt_len: int, requested: Optional[int], param: str) -> int:
        """The max new tokens for a prompt: the request's, checked against the context, or the default
        clipped to what the context leaves. Refuses prompts over --max-prompt-tokens."""
        self.check_prompt_tokens(prompt_len)
        ctx = self.context_length
        if requested is None:
            budget = self.max_tokens if ctx is None else min(self.max_tokens, ctx - prompt_len)
            if budget < 1:
                raise bad_request(f"the prompt has {prompt_len} tokens and leaves no room to generate in the "
                                  f"model's context length of {ctx} tokens", code="context_length_exceeded")
            return budget
        if ctx is not None and prompt_len + requested > ctx:
            raise bad_request(f"the prompt ({prompt_len} tokens) plus {param} ({requested}) is "
                              f"{prompt_len + requested} tokens, more than the model's context length of {ctx} "
                              f"tokens", param=param, code="context_length_exceeded")
        return requested

    # -- prompts ------------------------------------------------------------------------------------
    def render_chat(self, messages: Any) -> str:
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list of {role, content}", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or \
                    not isinstance(m.get("content"), str):
                raise BadRequest(f"messages[{i}] must be {{role: system|user|assistant, content: string}}",
                                 param=f"messages.{i}")
        if self.template_name == "qwen_chat":
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            return text + "<|im_start|>assistant\n"
        users = [m["content"] for m in messages if m["role"] == "user"]
        if not users:
            raise BadRequest("messages need at least one user message", param="messages")
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        return self.template.format((system + "\n" if system else "") + users[-1])

    def check_prompt_chars(self, text: str) -> None:
        """Refuse a text too long to fit the prompt token limit by its length alone: tokenising it first
        cost time and memory in proportion to the body (see `token_bound`)."""
        if self.max_prompt_chars is not None and len(text) > self.max_prompt_chars:
            raise bad_request(f"the prompt has {len(text)} characters, more than {self.max_prompt_tokens} tokens "
                              f"can hold (at most {self.chars_per_token} characters per token with this "
                              f"tokenizer; --max-prompt-tokens / --context-length)", code="context_length_exceeded")

    def encode(self, text: str) -> list[int]:
        """The prompt's token ids; a text over the character bound is refused before it is tokenised."""
        self.check_prompt_chars(text)
        ids = self.tokenizer(text)["input_ids"]
        if not ids:
            raise BadRequest("the prompt is empty after tokenisation")
        return ids

    # -- requests -----------------------------------------------------------------------------------
    def seed(self, seed: Optional[int], offset: int = 0) -> int:
        """The request's seed (or a fresh one), shifted by `offset` for the n-th choice, kept in range."""
        base = next(self._seeds) if seed is None else int(seed)
        value = base + offset
        return value - 2 ** 64 if value > SEED_MAX else max(value, SEED_MIN)

    def request(self, ids: list[int], sampling: SamplingParams, seed: int, specs: Optional[list] = None,
                rid: Optional[str] = None, return_routed_experts: bool = False) -> GenerateRequest:
        return GenerateRequest(rid or f"req-{uuid.uuid4().hex[:12]}", ids, sampling, seed, specs or [],
                               return_logprob=True, return_routed_experts=return_routed_experts)

    def check_specs(self, specs: list, seed: int) -> None:
        """Sampler specs are built here first: a bad one must fail its own request, not the whole batch."""
        from sglang_patches.request_sampler import SamplerChain

        try:
            chain = SamplerChain.from_specs(specs, seed)
        except Exception as exc:  # noqa: BLE001 - any construction failure is the request's fault
            raise bad_request(f"sampler specs: {type(exc).__name__}: {exc}", param="custom_params") from None
        if chain.needs_partner and getattr(self.engine, "partner", None) is None:
            raise bad_request("a sampler needs a partner model but this server has none", param="custom_params")
        if chain.needs_decode and getattr(self.engine, "decode", None) is None:
            raise bad_request("a sampler decodes text but this engine has no tokenizer", param="custom_params")

    # -- request extensions (the method registry's `serving` entries) --------------------------------------
    def extension(self, field: str) -> Any:
        """The registered request extension `field` (e.g. SxS's `speak_only`), built once with this tokenizer."""
        if field not in self._extensions:
            from slime_ext.methods.registry import load_object, serving_extensions

            path = serving_extensions().get(field)
            if path is None:
                raise BadRequest(f"{field}: no registered method offers this extension", param=field)
            try:
                self._extensions[field] = load_object(path)(self.tokenizer)
            except ValueError as exc:
                raise BadRequest(f"{field}: {exc}", param=field) from None
        return self._extensions[field]

    def active_extension(self, extra: Optional[dict[str, Any]]) -> Optional[tuple[str, Any]]:
        """(field, extension) of the registered extension a request turns on with a true body field, or None.
        The server knows extensions by their field only; each reads its own options from the body."""
        from slime_ext.methods.registry import serving_extensions

        on = [f for f in serving_extensions() if (extra or {}).get(f)]
        if len(on) > 1:
            raise BadRequest(f"request extensions {on} cannot be combined", param=on[1])
        return (on[0], self.extension(on[0])) if on else None

    def completion_text(self, res: GenerateResult) -> str:
        ids = [t for t in res.output_ids if t != self.tokenizer.eos_token_id]
        return self.tokenizer.decode(ids, skip_special_tokens=True)
