"""SGLang's native request bodies (`GenerateReqInput`, `SamplingParams`, `AbortReq`) as pydantic models,
validated as SGLang 0.5.21 validates them, so a body is accepted or refused here as it is there.

- Top level: every GenerateReqInput field with its type and default; pydantic in lax mode with unknown
  keys ignored (SGLang's FastAPI body parsing), then the checks of `normalize_batch_and_arguments`; a
  batch (a list of `input_ids` lists) is split into one request per prompt as SGLang splits it.
- `sampling_params`: every key SamplingParams takes (an unknown key is refused: SGLang builds
  `SamplingParams(**params)`), the ranges of `SamplingParams.verify`, numbers typed strictly (SGLang's
  verify fails on a string where a number belongs).
- What this server cannot honour (text prompts, parallel sampling, multimodal inputs, grammars,
  penalties, top logprobs, streaming, ...) is refused with a 400 naming the field rather than ignored;
  `tests/serving/test_serve_contract.py` lists each such difference from SGLang with its reason.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PlainValidator

from slime_ext.serving.errors import bad_request

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
MAX_STOP_COUNT = 32
StrictInt = Annotated[int, Field(strict=True)]
StrictFloat = Annotated[float, Field(strict=True)]  # ints are floats too, as in Python
StrictBool = Annotated[bool, Field(strict=True)]


def _i64_list(v: Any) -> list[int]:
    if not isinstance(v, list):
        raise ValueError(f"must be list; got {type(v).__name__}")
    if v and not isinstance(v[0], int):
        raise ValueError(f"elements must be int; got {type(v[0]).__name__}")
    try:
        array("q", v)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"contains non-int64 element: {exc}") from None
    return v


def _ids_1d_2d(v: Any) -> Any:
    """sglang.srt.utils.field_validators.validate_optional_list_i64_1d_2d."""
    if v is None:
        return v
    if not isinstance(v, list):
        raise ValueError(f"must be list or null; got {type(v).__name__}")
    if not v or isinstance(v[0], int):
        return _i64_list(v)
    if isinstance(v[0], list):
        for i, row in enumerate(v):
            try:
                _i64_list(row)
            except ValueError as exc:
                raise ValueError(f"row {i}: {exc}") from None
        return v
    raise ValueError(f"must be list[int] or list[list[int]]; got list of {type(v[0]).__name__}")


OptStr = Optional[str]
OptInt = Optional[int]
IntOrList = Optional[Union[list[Optional[int]], int]]
StrOrList = Optional[Union[list[Optional[str]], str]]
HiddenStatesMode = Union[bool, Literal["last"]]
LogprobsMode = Literal["selected", "support"]


class GenerateReqInput(BaseModel):
    """sglang.srt.managers.io_struct.GenerateReqInput (0.5.21), every field."""

    model_config = ConfigDict(extra="ignore")

    rid: Optional[Union[str, list[str]]] = None
    session_id: OptStr = None
    text: Optional[Union[list[str], str]] = None
    input_ids: Annotated[Any, PlainValidator(_ids_1d_2d)] = None
    input_embeds: Optional[Union[list[list[list[float]]], list[list[float]]]] = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    mm_hashes: Optional[Union[list[str], list[list[str]]]] = None
    mm_content_hashes: Optional[Union[list[Optional[str]], list[list[Optional[str]]]]] = None
    use_audio_in_video: bool = False
    video_config: Optional[dict[str, Any]] = None
    sampling_params: Optional[Union[list[dict[str, Any]], dict[str, Any]]] = None
    return_logprob: Optional[Union[list[bool], bool]] = None
    logprob_start_len: Optional[Union[list[int], int]] = None
    top_logprobs_num: Optional[Union[list[int], int]] = None
    token_ids_logprob: Optional[Union[list[list[int]], list[int]]] = None
    return_sampling_mask: Optional[Union[list[bool], bool]] = None
    sampling_logprobs_mode: Optional[Union[list[Optional[LogprobsMode]], LogprobsMode]] = None
    return_text_in_logprobs: bool = False
    return_flat_raw_top_logprobs: bool = False
    return_flat_raw_top_logprobs_b64: bool = False
    stream: bool = False
    log_metrics: bool = True
    return_hidden_states: Union[list[HiddenStatesMode], HiddenStatesMode] = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    return_indexer_topk: bool = False
    modalities: Optional[list[str]] = None
    session_params: Optional[dict[str, Any]] = None
    lora_path: StrOrList = None
    lora_id: StrOrList = None
    custom_logit_processor: StrOrList = None
    positional_embed_overrides: Any = None
    bootstrap_host: StrOrList = None
    bootstrap_port: IntOrList = None
    bootstrap_room: IntOrList = None
    bootstrap_pair_key: StrOrList = None
    decode_tp_size: IntOrList = None
    routed_dp_rank: OptInt = None
    data_parallel_rank: OptInt = None
    disagg_prefill_dp_rank: OptInt = None
    routing_key: OptStr = None
    conversation_id: OptStr = None
    http_worker_ipc: OptStr = None
    background: bool = False
    require_reasoning: bool = False
    max_thinking_tokens: OptInt = None
    priority: OptInt = None
    extra_key: Optional[Union[list[str], str]] = None
    no_logs: bool = False
    custom_labels: Optional[dict[str, str]] = None
    return_bytes: bool = False
    return_entropy: bool = False
    return_prompt_token_ids: bool = False
    external_trace_header: Optional[dict[str, Any]] = None
    received_time: Optional[float] = None
    need_wait_for_mm_inputs: Optional[bool] = None
    num_items_assigned: Optional[dict[Any, list[int]]] = None
    encoder_urls: Optional[list[str]] = None
    max_dynamic_patch: OptInt = None
    min_dynamic_patch: OptInt = None
    image_max_dynamic_patch: OptInt = None
    video_max_dynamic_patch: OptInt = None
    images_config: Optional[dict] = None
    multi_item_delimiter_indices: Optional[Union[list[list[int]], list[int]]] = None
    token_indices_to_pool: Optional[Union[list[list[int]], list[int]]] = None
    cache_salt: Optional[Union[list[str], str]] = None
    kv_hints: Any = None


# Fields this server cannot honour: refused unless absent or at a value that means "off".
_OFF: dict[str, tuple[Any, ...]] = {
    "stream": (False,), "text": (None,), "input_embeds": (None,), "image_data": (None, []), "video_data": (None, []),
    "audio_data": (None, []), "mm_hashes": (None,), "mm_content_hashes": (None,), "use_audio_in_video": (False,),
    "video_config": (None,), "top_logprobs_num": (None, 0), "token_ids_logprob": (None, []),
    "return_sampling_mask": (None, False), "sampling_logprobs_mode": (None,),
    "return_flat_raw_top_logprobs": (False,), "return_hidden_states": (False,), "routed_experts_start_len": (0,),
    "return_indexer_topk": (False,), "modalities": (None,), "session_id": (None,), "session_params": (None,),
    "lora_id": (None,), "positional_embed_overrides": (None,), "background": (False,),
    "require_reasoning": (False,), "max_thinking_tokens": (None,), "return_bytes": (False,),
    "return_entropy": (False,), "return_prompt_token_ids": (False,), "encoder_urls": (None,),
    "multi_item_delimiter_indices": (None,), "token_indices_to_pool": (None,), "kv_hints": (None, {}),
    "max_dynamic_patch": (None,), "min_dynamic_patch": (None,), "image_max_dynamic_patch": (None,),
    "video_max_dynamic_patch": (None,), "images_config": (None,),
}
_REASONS = {"text": "it takes token ids ('input_ids')", "stream": "use stream: false",
            "top_logprobs_num": "only the sampled tokens' logprobs are returned"}


@dataclass
class GenerateItem:
    """One request of a /generate body (a single request, or one row of a batch)."""

    input_ids: Any
    sampling_params: Any
    rid: Optional[str]
    return_logprob: bool
    where: str  # how errors name this row: "" for a single request, "[i]" for row i of a batch
    logprob_start_len: int = -1  # >= 0: input token logprobs from this position (prefill-only scoring)
    lora_path: Optional[str] = None  # the LoRA adapter (a name /load_lora_adapter_from_tensors loaded); None: base


def _per_row(body: GenerateReqInput, name: str, size: int, default: Any) -> list[Any]:
    """A batch field as one value per row: a list must have one entry per prompt; anything else is shared."""
    value = getattr(body, name)
    if not isinstance(value, list):
        return [default if value is None else value] * size
    if len(value) != size:
        raise bad_request(f"{name} has {len(value)} entries for a batch of {size} prompts", param=name)
    return list(value)


def generate_items(body: GenerateReqInput) -> list[GenerateItem]:
    """SGLang's normalisation checks (`normalize_batch_and_arguments`), then this server's refusals (400
    naming the field). A batch (`input_ids` a list of lists) becomes one item per prompt, as SGLang splits it:
    `rid`, `sampling_params`, `return_logprob` are per row when lists, shared otherwise; a string rid
    becomes `<rid>_<i>`."""
    if body.text is None and body.input_ids is None and body.input_embeds is None:
        raise bad_request("Either text, input_ids or input_embeds should be provided.", param="input_ids")
    if body.input_ids == [] and body.text is None:
        raise bad_request("input_ids cannot be empty.", param="input_ids")
    for name in ("extra_key", "cache_salt"):
        if isinstance(getattr(body, name), list):
            raise bad_request(f"{name} must be one string here, also for a batch", param=name)
    for name, off in _OFF.items():
        value = getattr(body, name)
        if not any(value is o or (type(value) is type(o) and value == o) for o in off):
            reason = _REASONS.get(name, "this server does not implement it")
            raise bad_request(f"'{name}' is not supported by this server: {reason}", param=name)
    ids = body.input_ids
    if not (isinstance(ids, list) and ids and isinstance(ids[0], list)):
        single = [(name, getattr(body, name)) for name in ("rid", "sampling_params", "return_logprob")]
        for name, value in single:
            if isinstance(value, list):
                raise bad_request(f"{name} is a list but input_ids is one prompt (a batch sends a list of prompts)",
                                  param=name)
        if isinstance(body.lora_path, list):
            raise bad_request("lora_path is a list but input_ids is one prompt", param="lora_path")
        return [GenerateItem(ids, body.sampling_params or {}, body.rid, bool(body.return_logprob), "",
                             _start_len(body.logprob_start_len, "logprob_start_len"), body.lora_path)]
    size = len(ids)
    if isinstance(body.rid, str):
        rids: list[Optional[str]] = [f"{body.rid}_{i}" for i in range(size)]
    elif body.rid is None:
        rids = [None] * size
    else:
        if len(body.rid) != size:
            raise bad_request("The specified rids length mismatch with the batch_size for batch processing.",
                              param="rid")
        rids = list(body.rid)
        duplicates = sorted({r for r in rids if rids.count(r) > 1})
        if duplicates:
            raise bad_request(f"Duplicate request IDs detected within the request: {duplicates}", param="rid")
    sampling = _per_row(body, "sampling_params", size, {})
    logprob = _per_row(body, "return_logprob", size, False)
    starts = _per_row(body, "logprob_start_len", size, -1)
    loras = _per_row(body, "lora_path", size, None)
    return [GenerateItem(ids[i], sampling[i], rids[i], bool(logprob[i]), f"[{i}]",
                         _start_len(starts[i], f"logprob_start_len[{i}]"), loras[i]) for i in range(size)]


def _start_len(value: Any, where: str) -> int:
    """SGLang's logprob_start_len of one row: None or -1 (no input logprobs), else a position >= 0."""
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise bad_request(f"{where} must be -1 or a token position >= 0, got {value!r}", param="logprob_start_len")
    return value


class SamplingParamsBody(BaseModel):
    """The keys sglang.srt.sampling.sampling_params.SamplingParams takes (unknown keys are refused)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: Optional[StrictInt] = None  # None: the server's default (--max-tokens, within the context)
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[StrictInt]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    temperature: Optional[StrictFloat] = None
    top_p: Optional[StrictFloat] = None
    top_k: Optional[StrictInt] = None
    min_p: Optional[StrictFloat] = None
    frequency_penalty: Optional[StrictFloat] = None
    presence_penalty: Optional[StrictFloat] = None
    repetition_penalty: Optional[StrictFloat] = None
    min_new_tokens: Optional[StrictInt] = None
    n: Optional[StrictInt] = None
    beam_width: Optional[StrictInt] = None
    json_schema: OptStr = None
    regex: OptStr = None
    ebnf: OptStr = None
    structural_tag: OptStr = None
    ignore_eos: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None  # text only: accepted (the text skips special tokens)
    spaces_between_special_tokens: Optional[bool] = None
    no_stop_trim: Optional[bool] = None
    stream_interval: OptInt = None
    logit_bias: Optional[dict[str, float]] = None
    sampling_seed: Optional[StrictInt] = None
    custom_params: Optional[dict[str, Any]] = None  # SamplingParams(**params) does not check its values
    # SamplingParams' internal fields are keyword arguments too; SGLang accepts them, so do we (ignored)
    stop_strs: Optional[Union[str, list[str]]] = None
    stop_regex_strs: Optional[Union[str, list[str]]] = None
    stop_str_max_len: Optional[int] = None
    stop_regex_max_len: Optional[int] = None
    is_normalized: Optional[bool] = None
    ebnf_full_assistant: Optional[bool] = None


def _need(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise bad_request(message, param=f"sampling_params.{param}", code="invalid_value")


def check_sampling(sp: SamplingParamsBody, vocab_size: Optional[int]) -> None:
    """SamplingParams.__post_init__ / normalize / verify (SGLang's messages), then this server's refusals."""
    temperature = 1.0 if sp.temperature is None else sp.temperature
    top_p = 1.0 if sp.top_p is None else sp.top_p
    top_k = -1 if sp.top_k is None else sp.top_k
    min_p = sp.min_p or 0.0
    min_new = sp.min_new_tokens or 0
    _need(sp.beam_width is None or sp.beam_width >= 1, f"beam_width must be at least 1, got {sp.beam_width}.",
          "beam_width")
    _need(math.isfinite(temperature) and temperature >= 0.0,
          f"temperature must be a non-negative finite number, got {temperature}.", "temperature")
    _need(0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}.", "top_p")
    _need(0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p}.", "min_p")
    _need(top_k == -1 or top_k >= 1, f"top_k must be -1 (disable) or at least 1, got {top_k}.", "top_k")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(sp, name) or 0.0
        _need(-2.0 <= value <= 2.0, f"{name} must be in [-2, 2], got {value}.", name)
    rep = 1.0 if sp.repetition_penalty is None else sp.repetition_penalty
    _need(0.0 < rep <= 2.0, f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {rep}.",
          "repetition_penalty")
    _need(min_new >= 0, f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.", "min_new_tokens")
    if sp.max_new_tokens is not None:
        _need(sp.max_new_tokens >= 0, f"max_new_tokens must be at least 0, got {sp.max_new_tokens}.", "max_new_tokens")
        _need(min_new <= sp.max_new_tokens, f"min_new_tokens must be in [0, max_new_tokens({sp.max_new_tokens})], "
              f"got {min_new}.", "min_new_tokens")
    for key in sp.logit_bias or {}:
        try:
            ok = 0 <= int(key) < (vocab_size or 2 ** 31)
        except ValueError:
            ok = False
        _need(ok, f"logit_bias must has keys in [0, {(vocab_size or 2 ** 31) - 1}], got {key}.", "logit_bias")
    if sp.sampling_seed is not None:
        _need(INT64_MIN <= sp.sampling_seed <= INT64_MAX,
              f"sampling_seed must be in [-2**63, 2**63 - 1], got {sp.sampling_seed}.", "sampling_seed")
    _need(sum(bool(getattr(sp, g)) for g in ("json_schema", "regex", "ebnf", "structural_tag")) <= 1,
          "Only one of json_schema, regex, ebnf, or structural_tag can be set.", "json_schema")
    if sp.stop is not None and not isinstance(sp.stop, str):
        _need(len(sp.stop) <= MAX_STOP_COUNT, f"at most {MAX_STOP_COUNT} stop strings are allowed, got "
              f"{len(sp.stop)}", "stop")
    # what SGLang would do but this server cannot
    unsupported = {
        "n": sp.n not in (None, 1), "beam_width": sp.beam_width not in (None, 1), "min_p": min_p != 0.0,
        "frequency_penalty": bool(sp.frequency_penalty), "presence_penalty": bool(sp.presence_penalty),
        "repetition_penalty": rep != 1.0, "min_new_tokens": min_new != 0, "ignore_eos": bool(sp.ignore_eos),
        "logit_bias": bool(sp.logit_bias), "stop_regex": bool(sp.stop_regex),
        "json_schema": bool(sp.json_schema), "regex": bool(sp.regex), "ebnf": bool(sp.ebnf),
        "structural_tag": bool(sp.structural_tag),
    }
    for name, refused in unsupported.items():
        if refused:
            raise bad_request(f"sampling_params.{name} is not supported by this server",
                              param=f"sampling_params.{name}")


class WeightVersionSpan(BaseModel):
    version: str
    start: int
    end: int


class PauseGenerationReqInput(BaseModel):
    """sglang.srt.managers.io_struct.PauseGenerationReqInput."""

    model_config = ConfigDict(extra="ignore")

    rid: Optional[str] = None
    http_worker_ipc: Optional[str] = None
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueGenerationReqInput(BaseModel):
    """sglang.srt.managers.io_struct.ContinueGenerationReqInput (torch_empty_cache means nothing on CPU)."""

    model_config = ConfigDict(extra="ignore")

    rid: Optional[str] = None
    http_worker_ipc: Optional[str] = None
    torch_empty_cache: bool = True


class AbortReq(BaseModel):
    """sglang.srt.managers.io_struct.AbortReq; rid None means "" (abort nothing), as there."""

    model_config = ConfigDict(extra="ignore")

    rid: Optional[str] = None
    http_worker_ipc: Optional[str] = None
    abort_all: bool = False
    finished_reason: Optional[dict[str, Optional[Union[str, int, list[int]]]]] = None
    abort_message: Optional[str] = None
    weight_versions: Optional[list[WeightVersionSpan]] = None
