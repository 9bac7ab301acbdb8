"""SGLang's weight and model-info routes: a trainer updates this server exactly as an SGLang 0.5.21 server.

Bodies mirror `sglang/srt/managers/io_struct.py` (same field names, types, defaults; validated as SGLang's
HTTP layer does: pydantic in lax mode, unknown keys ignored); answers are SGLang's: `{"success",
"message"}` (+ `num_paused_requests` for disk updates), 200 on success and 400 with success false on
failure. A malformed body is a 400 naming the field, as on every route of this server.

    POST /update_weights_from_disk        every *.safetensors of model_path (HF names)
    POST /update_weights_from_tensor      MultiprocessingSerializer payloads, inside a session
    POST /load_lora_adapter_from_tensors  a PEFT adapter (one serialized copy per TP rank), merged into the weights
    POST /unload_lora_adapter             the base weights back
    POST /begin_weight_update, /end_weight_update
    POST /init_weights_update_group       join the trainer's group (rank 0 hosts the tcp:// store)
    POST /destroy_weights_update_group
    POST /update_weights_from_distributed broadcast from rank 0, inside a session
    POST /update_weight_version
    GET  /model_info, /get_model_info
    GET|POST /get_weights_by_name         the first rows of a parameter (checks after an update)
    GET|POST /release_memory_occupation, /resume_memory_occupation
    GET|POST /weights_checker             snapshot / reset_tensors / compare / checksum (`weight_checker`)

Updates run off the event loop (`/health` keeps answering while a group join waits for the trainer) and
never while a `generate` call runs (see `weights.WeightUpdater.apply`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Callable, Literal, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict
from starlette.concurrency import run_in_threadpool

from slime_ext.serving.openai_routes import get_state, read_json
from slime_ext.serving.schemas import parse
from slime_ext.serving.weights import WeightUpdateError

router = APIRouter()
Selector = Literal["target", "draft", "all"]


def _base64(value: Any) -> Any:
    """sglang.srt.utils.msgspec_utils.Base64Bytes: strings (also inside lists) are base64-decoded."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error as exc:
            raise ValueError("Expected base64-encoded bytes") from exc
    if isinstance(value, (list, tuple)):
        return type(value)(_base64(v) for v in value)
    return value


class BaseReq(BaseModel):
    """io_struct.BaseReq: unknown keys are ignored, as SGLang's msgspec-to-pydantic schema does."""

    model_config = ConfigDict(extra="ignore")

    rid: Optional[str] = None
    http_worker_ipc: Optional[str] = None


class UpdateWeightFromDiskReqInput(BaseReq):
    model_path: str
    load_format: Optional[str] = None
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0
    flush_cache: bool = True
    manifest: Optional[dict[str, Any]] = None


class UpdateWeightsFromTensorReqInput(BaseReq):
    serialized_named_tensors: Annotated[list[bytes], BeforeValidator(_base64)]
    load_format: Optional[str] = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    selector: Selector = "all"
    torch_empty_cache: bool = False


class UpdateWeightsFromDistributedReqInput(BaseReq):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    load_format: Optional[str] = None
    selector: Selector = "all"
    torch_empty_cache: bool = False


class InitWeightsUpdateGroupReqInput(BaseReq):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class DestroyWeightsUpdateGroupReqInput(BaseReq):
    group_name: str = "weight_update_group"


class UpdateWeightVersionReqInput(BaseReq):
    new_version: str
    abort_all_requests: bool = True


class GetWeightsByNameReqInput(BaseReq):
    name: str
    truncate_size: int = 100


class MemoryOccupationReqInput(BaseReq):
    """ReleaseMemoryOccupationReqInput / ResumeMemoryOccupationReqInput."""

    tags: Optional[list[str]] = None


class LoadLoRAAdapterFromTensorsReqInput(BaseReq):
    lora_name: str
    config_dict: dict[str, Any]
    serialized_named_tensors: Annotated[list[bytes], BeforeValidator(_base64)]
    pinned: bool = False
    added_tokens_config: Optional[dict[str, int]] = None
    lora_id: Optional[str] = None
    load_format: Optional[str] = None
    expected_checksums: Optional[dict[str, str]] = None


class UnloadLoRAAdapterReqInput(BaseReq):
    lora_name: str
    lora_id: Optional[str] = None


class BeginWeightUpdateReqInput(BaseReq):
    selector: Selector = "all"


class EndWeightUpdateReqInput(BaseReq):
    pass


def outcome(success: bool, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": success, "message": message, **extra}, status_code=200 if success else 400)


async def _run(fn: Callable[..., str], *args: Any, **extra: Any) -> JSONResponse:
    """`fn(*args)` on a worker thread: its message on success, a 400 with its error otherwise."""
    try:
        message = await run_in_threadpool(fn, *args)
    except WeightUpdateError as exc:
        return outcome(False, str(exc), **extra)
    return outcome(True, message, **extra)


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse(UpdateWeightFromDiskReqInput, await read_json(state, request))
    return await _run(state.weights.from_disk, body.model_path, body.load_format, body.weight_version,
                      body.abort_all_requests, num_paused_requests=0)


@router.post("/update_weights_from_tensor")
async def update_weights_from_tensor(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse(UpdateWeightsFromTensorReqInput, await read_json(state, request))
    return await _run(state.weights.from_tensor, body.serialized_named_tensors, body.load_format,
                      body.weight_version, body.abort_all_requests)


@router.post("/load_lora_adapter_from_tensors")
async def load_lora_adapter_from_tensors(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse(LoadLoRAAdapterFromTensorsReqInput, await read_json(state, request))
    return await _run(state.weights.load_lora, body.lora_name, body.config_dict, body.serialized_named_tensors,
                      body.load_format)


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse(UnloadLoRAAdapterReqInput, await read_json(state, request))
    return await _run(state.weights.unload_lora, body.lora_name)


@router.post("/begin_weight_update")
async def begin_weight_update(request: Request) -> JSONResponse:
    state = get_state(request)
    parse(BeginWeightUpdateReqInput, await read_json(state, request))
    return await _run(state.weights.begin)


@router.post("/end_weight_update")
async def end_weight_update(request: Request) -> JSONResponse:
    state = get_state(request)
    parse(EndWeightUpdateReqInput, await read_json(state, request))
    return await _run(state.weights.end)


@router.post("/init_weights_update_group")
async def init_weights_update_group(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse(InitWeightsUpdateGroupReqInput, await read_json(state, request))
    return await _run(state.weights.init_group, body.master_address, body.master_port, body.rank_offset,
                      body.world_size, body.group_name, body.backend)


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse(DestroyWeightsUpdateGroupReqInput, await read_json(state, request))
    return await _run(state.weights.destroy_group, body.group_name)


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse(UpdateWeightsFromDistributedReqInput, await read_json(state, request))
    return await _run(state.weights.from_distributed, body.names, body.dtypes, body.shapes, body.group_name,
                      body.load_format, body.weight_version, body.abort_all_requests)


@router.post("/update_weight_version")
async def update_weight_version(request: Request) -> JSONResponse:
    state = get_state(request)
    body = parse(UpdateWeightVersionReqInput, await read_json(state, request))
    await run_in_threadpool(state.weights.set_version, body.new_version, body.abort_all_requests)
    return outcome(True, f"Weight version updated to {body.new_version}", new_version=body.new_version)


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request) -> dict[str, Any]:
    state = get_state(request)
    config = getattr(getattr(state.engine, "model", None), "config", None)
    return {
        "model_path": state.model_path, "served_model_name": state.model_name, "tokenizer_path": state.tokenizer_path,
        "is_generation": True, "preferred_sampling_params": None, "weight_version": state.weight_version,
        "model_type": getattr(config, "model_type", None), "architectures": getattr(config, "architectures", None),
    }


@router.api_route("/get_weights_by_name", methods=["GET", "POST"])
async def get_weights_by_name(request: Request) -> JSONResponse:
    """The first `truncate_size` rows of a parameter (HF name, per-expert names too), as SGLang answers."""
    state = get_state(request)
    body = parse(GetWeightsByNameReqInput, await read_json(state, request))
    try:
        value = await run_in_threadpool(state.weights.get, body.name, body.truncate_size)
    except WeightUpdateError as exc:
        return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
    return JSONResponse(value)


async def _memory(request: Request, action: str) -> JSONResponse:
    state = get_state(request)
    body = parse(MemoryOccupationReqInput, await read_json(state, request))
    try:
        await run_in_threadpool(state.weights.memory, action, body.tags)
    except WeightUpdateError as exc:
        return outcome(False, str(exc))
    return JSONResponse(None)  # SGLang answers 200 with a null body


class CheckWeightsReqInput(BaseReq):
    action: str = "checksum"
    allow_quant_error: bool = False
    skip_tensor_list: Optional[list[str]] = None
    selector: Selector = "all"


@router.api_route("/weights_checker", methods=["GET", "POST"])
async def weights_checker(request: Request) -> JSONResponse:
    """SGLang's weight checker: 200 `{"success", "message"}` (+ `ranks` and `per_engine_checksum` for a
    checksum), 400 with success false when the action fails (a compare that found differences)."""
    from slime_ext.serving.weight_checker import WeightCheckError

    state = get_state(request)
    raw = await read_json(state, request) if request.method == "POST" else {}
    body = parse(CheckWeightsReqInput, raw or {})
    try:
        extra = await run_in_threadpool(state.weights.check_weights, body.action, body.skip_tensor_list)
    except (WeightCheckError, WeightUpdateError) as exc:
        return outcome(False, str(exc))
    return outcome(True, "Success.", **(extra or {}))


@router.api_route("/release_memory_occupation", methods=["GET", "POST"])
async def release_memory_occupation(request: Request) -> JSONResponse:
    return await _memory(request, "release")


@router.api_route("/resume_memory_occupation", methods=["GET", "POST"])
async def resume_memory_occupation(request: Request) -> JSONResponse:
    return await _memory(request, "resume")
