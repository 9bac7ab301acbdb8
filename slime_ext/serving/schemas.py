"""OpenAI request bodies as pydantic models: wrong types and out-of-range values become a 400 naming the
field (SGLang's native bodies are in `native_schemas`).

Unknown fields are ignored (OpenAI SDKs send many this server has no use for, e.g. `user`), unless a registered
request extension claims them (`ServerState.active_extension`); fields whose meaning the server cannot honour
are refused explicitly in the routes instead of being dropped silently.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from slime_ext.serving.errors import bad_request

# torch.Generator.manual_seed and SGLang's sampling_seed take int64 or uint64 values: anything else is refused
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 64 - 1
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]
Finite = Annotated[float, Field(allow_inf_nan=False)]


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    temperature: Optional[Annotated[Finite, Field(ge=0)]] = None
    top_p: Optional[Annotated[Finite, Field(gt=0, le=1)]] = None
    top_k: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[Annotated[int, Field(ge=0)]]] = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v != -1 and v < 1:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return v


class _OpenAIRequest(_Sampling):
    # unknown fields are kept (in `model_extra`, ignored by default) so that a request extension registered by
    # a method (`slime_ext.methods.registry`, `serving`) can read its own fields; this model names none
    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    max_tokens: Optional[Annotated[int, Field(ge=0)]] = None
    seed: Optional[Seed] = None
    n: Optional[Annotated[int, Field(ge=1)]] = None
    stream: Optional[bool] = None


class ChatRequest(_OpenAIRequest):
    messages: Any = None  # checked by ServerState.render_chat (its messages name the offending index)
    max_completion_tokens: Optional[Annotated[int, Field(ge=0)]] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Annotated[int, Field(ge=0)]] = None


class CompletionRequest(_OpenAIRequest):
    prompt: Any = None  # a string or a list of token ids, checked by the route
    logprobs: Optional[Annotated[int, Field(ge=0)]] = None
    echo: Optional[bool] = None


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: dict[str, Any], prefix: Optional[str] = None) -> M:
    """`model` validated from `body`, or a 400 whose `param` is the first offending field (under `prefix`
    for a nested object)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)

        def loc(e: Any) -> str:
            return ".".join(str(p) for p in ([prefix] if prefix else []) + list(e["loc"]))

        first = loc(errors[0]) if errors else None
        message = "; ".join(f"{loc(e) or 'body'}: {e['msg']}" for e in errors[:5])
        raise bad_request(f"invalid request: {message}", param=first, code="invalid_value") from None
