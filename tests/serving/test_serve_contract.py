"""Contract with SGLang 0.5.21: the same request bodies go to this server and to SGLang's own request
classes (validated as SGLang's HTTP server and tokenizer manager do), and both must accept or both refuse
each one. Where this server deliberately differs, the difference is listed below with its reason.

SGLang's io_struct does not import on a CPU-only install (it pulls in torchvision, sentencepiece, ...
through the multimodal and quantization modules); the fixture stubs the missing packages for the import
only and removes every trace afterwards. If io_struct still cannot be loaded, the behavioural test is
skipped and only the field-name test (from the source, by `ast`) runs.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings
from typing import Any

import httpx
import pytest

from slime_ext.serving import ServerState, serve
from slime_ext.serving import native_schemas, weight_routes
from tests.serving.serve_stub import StubEngine

OK, BAD = "accept", "reject"
CONTEXT = 4096
BIG = 2 ** 63


# -- the bodies ------------------------------------------------------------------------------------
def gen(sp: dict | None = None, **top: Any) -> dict:
    body = {"input_ids": [5, 6, 7], **top}
    if sp is not None:
        body["sampling_params"] = sp
    return body


# (route, body, the verdict both must give)
AGREE: list[tuple[str, dict, str]] = [
    ("/generate", gen(), OK),
    ("/generate", gen({"max_new_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "sampling_seed": 3},
                      rid="r1", return_logprob=True), OK),
    ("/generate", gen({"temperature": 0, "top_k": -1, "max_new_tokens": 0}), OK),
    ("/generate", gen({"max_new_tokens": 0}, return_logprob=True, logprob_start_len=1), OK),  # prefill scoring
    ("/generate", gen({"temperature": None, "top_p": None, "top_k": None, "max_new_tokens": None}), OK),
    ("/generate", gen({"sampling_seed": -BIG}), OK),
    ("/generate", gen({"sampling_seed": BIG - 1}), OK),
    ("/generate", gen({"stop": "x", "stop_token_ids": [3], "custom_params": {"k": 1}}), OK),
    ("/generate", gen({"stop": ["a", "b"], "skip_special_tokens": False, "n": 1}), OK),
    ("/generate", gen(unknown_key=1, log_metrics=False, routing_key="k", priority=3, custom_logit_processor="p"), OK),
    ("/generate", gen(return_logprob="yes"), OK),  # pydantic's lax bool, in both
    ("/generate", {}, BAD),
    ("/generate", {"input_ids": []}, BAD),
    ("/generate", {"input_ids": "abc"}, BAD),
    ("/generate", {"input_ids": ["a"]}, BAD),
    ("/generate", {"input_ids": [1.5]}, BAD),
    ("/generate", {"input_ids": [2 ** 64]}, BAD),
    ("/generate", {"input_ids": [-1]}, BAD),
    ("/generate", {"input_ids": [10 ** 7]}, BAD),  # past the vocabulary
    ("/generate", {"input_ids": [5] * CONTEXT}, BAD),  # the prompt fills the context
    ("/generate", gen({"max_new_tokens": CONTEXT}), BAD),  # prompt + max_new_tokens past the context
    ("/generate", gen({"max_new_tokens": -1}), BAD),
    ("/generate", gen({"max_new_tokens": "5"}), BAD),
    ("/generate", gen({"temperature": -0.1}), BAD),
    ("/generate", gen({"temperature": "0.5"}), BAD),
    ("/generate", gen({"top_p": 1.5}), BAD),
    ("/generate", gen({"top_p": 0}), BAD),
    ("/generate", gen({"top_k": 0}), BAD),
    ("/generate", gen({"top_k": -2}), BAD),
    ("/generate", gen({"min_p": 2}), BAD),
    ("/generate", gen({"frequency_penalty": 3}), BAD),
    ("/generate", gen({"repetition_penalty": 0}), BAD),
    ("/generate", gen({"max_new_tokens": 2, "min_new_tokens": 5}), BAD),
    ("/generate", gen({"sampling_seed": BIG}), BAD),
    ("/generate", gen({"sampling_seed": -BIG - 1}), BAD),
    ("/generate", gen({"sampling_seed": "7"}), BAD),
    ("/generate", gen({"stop": [str(i) for i in range(33)]}), BAD),
    ("/generate", gen({"regex": "a", "ebnf": "b"}), BAD),
    ("/generate", gen({"logit_bias": {"-1": 1.0}}), BAD),
    ("/generate", gen({"no_such_param": 1}), BAD),
    ("/generate", gen("greedy"), BAD),
    ("/generate", gen(rid=5), BAD),
    ("/generate", gen(return_logprob="maybe"), BAD),
    ("/generate", gen(priority="high"), BAD),
    ("/generate", gen(extra_key=["a"]), BAD),
    ("/generate", gen([{"max_new_tokens": 2}]), BAD),  # a list of sampling_params with one prompt
    ("/update_weights_from_disk", {"model_path": "/nonexistent"}, OK),
    ("/update_weights_from_disk", {"model_path": "/x", "weight_version": "2", "abort_all_requests": True,
                                   "load_format": None, "flush_cache": False, "unknown": [1]}, OK),
    ("/update_weights_from_disk", {"model_path": "/x", "abort_all_requests": "yes", "token_step": "3"}, OK),
    ("/update_weights_from_disk", {}, BAD),
    ("/update_weights_from_disk", {"model_path": 5}, BAD),
    ("/update_weights_from_disk", {"model_path": None}, BAD),
    ("/update_weights_from_disk", {"model_path": "/x", "weight_version": 3}, BAD),
    ("/update_weights_from_disk", {"model_path": "/x", "abort_all_requests": "maybe"}, BAD),
    ("/update_weights_from_disk", {"model_path": "/x", "token_step": 1.5}, BAD),
    ("/update_weights_from_disk", {"model_path": "/x", "manifest": "m"}, BAD),
    ("/update_weights_from_tensor", {"serialized_named_tensors": ["gARdlC4="], "weight_version": "3"}, OK),
    ("/update_weights_from_tensor", {"serialized_named_tensors": [], "load_format": "direct", "x": 1}, OK),
    ("/update_weights_from_tensor", {}, BAD),
    ("/update_weights_from_tensor", {"serialized_named_tensors": "gARdlC4="}, BAD),
    ("/update_weights_from_tensor", {"serialized_named_tensors": ["%%%"]}, BAD),
    ("/update_weights_from_tensor", {"serialized_named_tensors": [5]}, BAD),
    ("/update_weights_from_tensor", {"serialized_named_tensors": ["gARdlC4="], "selector": "both"}, BAD),
    ("/update_weights_from_tensor", {"serialized_named_tensors": ["gARdlC4="], "load_format": 5}, BAD),
    # rank_offset 0: parsed, then refused before any rendezvous (a valid join would wait for a trainer)
    ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 0,
                                    "world_size": 2, "group_name": "g", "backend": "gloo"}, OK),
    ("/init_weights_update_group", {"master_address": "h", "master_port": "1", "rank_offset": 0, "world_size": 2}, OK),
    ("/init_weights_update_group", {"master_address": "h", "rank_offset": 0, "world_size": 2}, BAD),
    ("/init_weights_update_group", {"master_address": "h", "master_port": "x", "rank_offset": 0, "world_size": 2}, BAD),
    ("/init_weights_update_group", {"master_address": 1, "master_port": 1, "rank_offset": 0, "world_size": 2}, BAD),
    ("/init_weights_update_group", {"master_address": "h", "master_port": 1, "rank_offset": 0, "world_size": 1.5}, BAD),
    ("/init_weights_update_group", {"master_address": "h", "master_port": 1, "rank_offset": None, "world_size": 2}, BAD),
    ("/init_weights_update_group", {"master_address": "h", "master_port": 1, "rank_offset": 0, "world_size": 2,
                                    "backend": 5}, BAD),
    ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[2, 3]]}, OK),
    ("/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": [], "group_name": "g",
                                          "weight_version": "4", "load_format": "flattened_bucket"}, OK),
    ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [["2"]]}, OK),
    ("/update_weights_from_distributed", {}, BAD),
    ("/update_weights_from_distributed", {"names": "a", "dtypes": ["float32"], "shapes": [[1]]}, BAD),
    ("/update_weights_from_distributed", {"names": ["a"], "dtypes": [1], "shapes": [[1]]}, BAD),
    ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1.5]]}, BAD),
    ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [1]}, BAD),
    ("/update_weights_from_distributed", {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]],
                                          "selector": "x"}, BAD),
    # batches: one request per prompt, fields per row when lists, shared otherwise
    ("/generate", {"input_ids": [[1, 2], [3]]}, OK),
    ("/generate", {"input_ids": [[1, 2], [3]], "rid": ["a", "b"], "return_logprob": [True, False],
                   "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 3, "temperature": 0.5}]}, OK),
    ("/generate", {"input_ids": [[1, 2], [3]], "rid": "a", "sampling_params": {"max_new_tokens": 2}}, OK),
    ("/generate", {"input_ids": [[1, 2], [3]], "rid": ["a"]}, BAD),
    ("/generate", {"input_ids": [[1, 2], [3]], "rid": ["a", "a"]}, BAD),
    ("/generate", {"input_ids": [[1, 2], [3]], "sampling_params": [{"max_new_tokens": 2}, {"top_p": 0}]}, BAD),
    ("/generate", {"input_ids": [[1, 2], [3, -1]]}, BAD),
    ("/abort_request", {}, OK),
    ("/abort_request", {"rid": "r1"}, OK),
    ("/abort_request", {"abort_all": True, "other": 1}, OK),
    ("/abort_request", {"abort_all": "yes"}, OK),
    ("/abort_request", {"finished_reason": {"type": "abort", "length": 3}}, OK),
    ("/abort_request", {"weight_versions": [{"version": "1", "start": 0, "end": 3}]}, OK),
    ("/abort_request", {"rid": 5}, BAD),
    ("/abort_request", {"abort_all": "maybe"}, BAD),
    ("/abort_request", {"weight_versions": [{"version": 1}]}, BAD),
    ("/update_weight_version", {"new_version": "2", "abort_all_requests": False}, OK),
    ("/update_weight_version", {}, BAD),
    ("/update_weight_version", {"new_version": 2}, BAD),
    ("/begin_weight_update", {"selector": "draft"}, OK),
    ("/begin_weight_update", {"selector": "both"}, BAD),
    ("/destroy_weights_update_group", {"group_name": 3}, BAD),
    ("/release_memory_occupation", {"tags": ["kv_cache"]}, OK),
    ("/release_memory_occupation", {"tags": "kv_cache"}, BAD),
]

# (route, body, this server's verdict, SGLang's verdict, why they differ)
UNSUPPORTED = "SGLang serves it; this server does not implement it and says so rather than ignore it"
DIFFER: list[tuple[str, dict, str, str, str]] = [
    ("/generate", {"text": "hello"}, BAD, OK, "this server takes token ids only (no text prompts)"),
    ("/generate", {"input_ids": [[1, 2], []]}, BAD, OK, "an empty prompt in a batch is refused with the batch "
                                                        "(SGLang's validation passes it to the scheduler)"),
    ("/generate", gen(rid=["a"]), BAD, OK, "a list rid names a batch (SGLang even accepts it with one prompt)"),
    ("/generate", gen(stream=True), BAD, OK, "no streaming on /generate (the OpenAI routes stream)"),
    ("/generate", gen({"n": 2}), BAD, OK, "parallel sampling: send n requests with their own seeds"),
    ("/generate", gen({"frequency_penalty": 0.5}), BAD, OK, UNSUPPORTED),
    ("/generate", gen({"repetition_penalty": 1.2}), BAD, OK, UNSUPPORTED),
    ("/generate", gen({"min_p": 0.1}), BAD, OK, UNSUPPORTED),
    ("/generate", gen({"min_new_tokens": 1}), BAD, OK, UNSUPPORTED),
    ("/generate", gen({"ignore_eos": True}), BAD, OK, UNSUPPORTED),
    ("/generate", gen({"regex": "[0-9]+"}), BAD, OK, UNSUPPORTED + " (grammars)"),
    ("/generate", gen({"logit_bias": {"5": 1.0}}), BAD, OK, UNSUPPORTED),
    ("/generate", gen(top_logprobs_num=2), BAD, OK, "only the sampled tokens' logprobs are returned"),
    ("/generate", gen(logprob_start_len=0), BAD, OK, "input logprobs only for prefill-only scoring "
                                                     "(max_new_tokens 0, tests/serving/test_pause_generation.py)"),
    ("/generate", gen(return_hidden_states=True), BAD, OK, UNSUPPORTED),
    ("/generate", gen(lora_path="adapter"), BAD, OK, UNSUPPORTED + " (no LoRA)"),
    ("/generate", gen(image_data="img.png"), BAD, OK, UNSUPPORTED + " (text-only models)"),
    ("/generate", {"input_ids": [True, 5]}, BAD, OK, "SGLang takes JSON booleans as token ids 1/0 (bool is an int "
                                                     "in Python); here a token id must be a JSON integer"),
    ("/generate", gen({"max_new_tokens": 5.0}), BAD, OK, "SamplingParams does not type-check its fields and its "
                                                         "verify only compares; here counts must be integers"),
]


# -- SGLang's side ----------------------------------------------------------------------------------
class _StubModule(types.ModuleType):
    """Any attribute is another stub; usable as a base class, a decorator, a type in annotations."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubModule(f"{self.__name__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _StubModule(f"{self.__name__}()")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (_StubBase,)

    def __getitem__(self, item: Any) -> Any:
        return self

    def __or__(self, other: Any) -> Any:
        return self

    __ror__ = __or__

    def __iter__(self):
        return iter(())

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()


class _StubBase:
    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    __get_pydantic_core_schema__ = _StubModule.__get_pydantic_core_schema__


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self.packages: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        return _StubModule(spec.name)

    def exec_module(self, module: Any) -> None:
        module.__path__ = []


@contextlib.contextmanager
def sglang_io_struct():
    """sglang.srt.managers.io_struct, importable while the block runs: packages it needs that are not
    installed (only those) are stubbed; afterwards the stubs, the finder, the sglang modules imported here,
    the environment and the warning filters are as before."""
    import transformers.utils.import_utils as hf_imports

    hf_imports.is_torchvision_available()  # transformers decides (False) before the stub exists
    import sglang.srt.sampling.sampling_params  # noqa: F401 - used by other tests: imported for good
    import sglang.srt.utils.common  # noqa: F401

    modules, env, filters = set(sys.modules), dict(os.environ), list(warnings.filters)
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        error: Exception | None = None
        for _ in range(20):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "Only CUDA ... support AWQ", ...
                    import sglang.srt.managers.io_struct as io_struct

                break
            except ModuleNotFoundError as exc:
                top = (exc.name or "").split(".")[0]
                if not top or top in finder.packages or importlib.util.find_spec(top) is not None:
                    error = exc
                    break
                finder.packages.add(top)
                for name in [m for m in sys.modules if m.startswith("sglang") and m not in modules]:
                    del sys.modules[name]
            except Exception as exc:  # noqa: BLE001
                error = exc
                break
        else:
            error = RuntimeError("too many missing packages")
        yield None if error is not None else io_struct, error, sorted(finder.packages)
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m not in modules and (
                m.startswith("sglang") or m.split(".")[0] in finder.packages)]:
            del sys.modules[name]
        os.environ.clear()
        os.environ.update(env)
        warnings.filters[:] = filters


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def sglang_verdict(io_struct: Any, route: str, body: dict, vocab: int) -> str:
    """Accept/reject as SGLang's FastAPI body parsing (pydantic, python mode) plus, for /generate, the
    tokenizer manager's normalisation, SamplingParams(**params).normalize().verify() and length checks,
    and the scheduler's vocabulary check."""
    from pydantic import TypeAdapter
    from sglang.srt.sampling.sampling_params import SamplingParams

    classes = {
        "/generate": "GenerateReqInput", "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
        "/update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
        "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
        "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput", "/abort_request": "AbortReq",
        "/update_weight_version": "UpdateWeightVersionReqInput", "/begin_weight_update": "BeginWeightUpdateReqInput",
        "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
        "/release_memory_occupation": "ReleaseMemoryOccupationReqInput",
    }
    try:
        obj = TypeAdapter(getattr(io_struct, classes[route])).validate_python(body, from_attributes=True)
        if route != "/generate":
            return OK
        obj.normalize_batch_and_arguments()
        items = [obj] if obj.is_single else [obj[i] for i in range(len(obj.rid))]
        for item in items:
            params = dict(item.sampling_params or {})
            sp = SamplingParams(**params)
            sp.normalize(_Tokenizer())
            sp.verify(vocab)
            ids = item.input_ids
            if ids is not None:
                if len(ids) >= CONTEXT:
                    return BAD
                if params.get("max_new_tokens") is not None and params["max_new_tokens"] + len(ids) > CONTEXT:
                    return BAD
                if any(not 0 <= int(t) < vocab for t in ids):
                    return BAD
        return OK
    except Exception:  # noqa: BLE001 - ValidationError, ValueError, TypeError: refused
        return BAD


# -- this server's side -----------------------------------------------------------------------------
class _Engine(StubEngine):
    max_context_length = CONTEXT

    def score(self, sequences: list, starts: list, model: str = "policy") -> list:  # prefill scoring's shape only
        return [[0.0] * (len(seq) - start) for seq, start in zip(sequences, starts)]


@pytest.fixture(scope="module")
def server():
    engine = _Engine()
    state = ServerState(engine, engine.tokenizer, "stub", max_tokens=8)
    srv = serve(state)
    yield srv, state
    srv.shutdown()
    state.batcher.close()


def our_verdict(client: httpx.Client, route: str, body: dict) -> str:
    """Parsed and run (200, or SGLang's 400 {"success": false} when the update itself fails) is an accept;
    a 400 with an error body (the request refused before it ran) is a reject."""
    r = client.post(route, json=body)
    assert r.status_code in (200, 400), (route, body, r.status_code, r.text)
    if r.status_code == 200:
        return OK
    return OK if r.json() is not None and "success" in r.json() else BAD


@pytest.mark.timeout(120)
def test_same_verdicts_as_sglang_io_struct(server):
    srv, state = server
    with sglang_io_struct() as (io_struct, error, stubbed):
        if io_struct is None:
            pytest.skip(f"sglang's io_struct does not import here even with stubs for {stubbed}: {error}")
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            mismatches = []
            for route, body, expected in AGREE:
                ours, theirs = our_verdict(client, route, body), sglang_verdict(io_struct, route, body, state.vocab_size)
                if not ours == theirs == expected:
                    mismatches.append(f"{route} {body}: expected {expected}, ours {ours}, sglang {theirs}")
            for route, body, ours_expected, theirs_expected, reason in DIFFER:
                ours, theirs = our_verdict(client, route, body), sglang_verdict(io_struct, route, body, state.vocab_size)
                if (ours, theirs) != (ours_expected, theirs_expected):
                    mismatches.append(f"{route} {body} (listed difference: {reason}): expected ours {ours_expected} "
                                      f"/ sglang {theirs_expected}, got {ours} / {theirs}")
    assert not mismatches, "\n".join(mismatches)


def test_mirrored_field_names_match_sglang_source():
    """Every mirror has exactly the fields of SGLang's class (read from io_struct.py by ast; works
    without importing it)."""
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams

    from slime_ext.engine.sglang_payload import io_struct_fields

    mirrors = {
        "GenerateReqInput": native_schemas.GenerateReqInput, "AbortReq": native_schemas.AbortReq,
        "UpdateWeightFromDiskReqInput": weight_routes.UpdateWeightFromDiskReqInput,
        "UpdateWeightsFromTensorReqInput": weight_routes.UpdateWeightsFromTensorReqInput,
        "UpdateWeightsFromDistributedReqInput": weight_routes.UpdateWeightsFromDistributedReqInput,
        "InitWeightsUpdateGroupReqInput": weight_routes.InitWeightsUpdateGroupReqInput,
        "DestroyWeightsUpdateGroupReqInput": weight_routes.DestroyWeightsUpdateGroupReqInput,
        "UpdateWeightVersionReqInput": weight_routes.UpdateWeightVersionReqInput,
        "ReleaseMemoryOccupationReqInput": weight_routes.MemoryOccupationReqInput,
        "ResumeMemoryOccupationReqInput": weight_routes.MemoryOccupationReqInput,
        "BeginWeightUpdateReqInput": weight_routes.BeginWeightUpdateReqInput,
        "EndWeightUpdateReqInput": weight_routes.EndWeightUpdateReqInput,
        "GetWeightsByNameReqInput": weight_routes.GetWeightsByNameReqInput,
    }
    for name, mirror in mirrors.items():
        assert set(mirror.model_fields) == set(io_struct_fields(name)), name
    assert set(native_schemas.SamplingParamsBody.model_fields) == {f.name for f in msgspec.structs.fields(SamplingParams)}
