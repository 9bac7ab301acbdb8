"""The SGLang client against a small real HTTP server that imitates SGLang's routes and response shapes
(taken from sglang 0.5.21's http_server.py / tokenizer_manager.py), and the server launcher's flags
against sglang's real argument parser and ServerArgs fields."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import torch

try:
    import msgspec
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
    from sglang.srt.sampling.sampling_params import SamplingParams as SGLangSamplingParams
except Exception as exc:  # noqa: BLE001
    print(f"sglang not importable: {exc}")
    pytest.skip(f"sglang not importable: {exc}", allow_module_level=True)

from sglang_patches import sglang_adapter as adapter
from sglang_patches.request_sampler import (
    SAMPLER_REGISTRY, CoinStream, Sampler, StepAction, register_sampler, replay_annotations,
)
from sglang_patches.decoding import SamplingParams
from slime_ext.config.sections import SGLangConfig
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.sglang_client import (
    PayloadError, SGLangEngineClient, io_struct_fields, validate_generate_payload, validate_payload,
)
from slime_ext.engine.sglang_launcher import SGLangServer, ServerArgsError, build_server_command

EOS = 1
VOCAB = 12


class ClientScripted(Sampler):
    """Test sampler: forces 5 at step 2, bans 3, counts tokens and draws a coin per token."""

    kind = "test_sglang_client_scripted"

    def __init__(self, seed: int):
        super().__init__(seed)
        self.count = 0
        self.coins = CoinStream(seed, "client")

    def adjust(self, logits, partner_logits, view):
        if view.step == 2:
            return StepAction(force_token=5)
        out = logits.clone()
        out[3] = -math.inf
        return StepAction(logits=out)

    def on_token(self, token_id, view):
        ann = {"n": self.count, "coin": round(self.coins.uniform(), 12)}
        self.count += 1
        return ann


if SAMPLER_REGISTRY.get(ClientScripted.kind) is None:
    register_sampler(ClientScripted)


# -- a fake SGLang server ---------------------------------------------------------------------------
class FakeReq:
    def __init__(self, rid: str, prompt: list[int]):
        self.rid, self.origin_input_ids, self.output_ids = rid, list(prompt), []


class FakeSGLang:
    """Serves /generate with a tiny deterministic 'model' (logits seeded by the context), running the
    request's custom logit processor the way SGLang does, plus the control routes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.log: list[tuple[str, Any]] = []
        self.status_plan: dict[str, list[int]] = {}  # logical rid -> statuses to answer first
        self.sleep_plan: dict[str, float] = {}
        self.radix: list[list[int]] = []
        self.in_flight = self.max_in_flight = 0
        self.abort_events: dict[str, threading.Event] = {}
        self.tokens_made: dict[str, int] = {}  # rid -> tokens generated so far (an abort test waits for some)
        self.weight_session = False
        self.received_tensors: list[list[tuple[str, torch.Tensor]]] = []
        self.flush_ok = True
        self.refuse_batches = False  # answer batches 422, as sglang-router does
        self.batch_sizes: list[int] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: Any = None):
                data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/health":
                    return self._reply(200)
                self._reply(404)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                payload = json.loads(self.rfile.read(n)) if n else None
                path = self.path.split("?")[0]
                with fake.lock:
                    fake.log.append((path, payload))
                try:
                    status, body = fake.route(path, payload)
                except Exception as exc:  # noqa: BLE001 - SGLang answers 400 with the message
                    status, body = 400, {"error": {"message": f"{type(exc).__name__}: {exc}"}}
                try:
                    self._reply(status, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def paths(self) -> list[str]:
        return [p for p, _ in self.log]

    # routes
    def route(self, path: str, payload: Any) -> tuple[int, Any]:
        if path == "/generate":
            return self.generate(payload)
        if path == "/abort_request":
            validate_payload(payload, "AbortReq")
            ev = self.abort_events.get(payload.get("rid"))
            if ev is not None:
                ev.set()
            return 200, None
        if path == "/flush_cache":
            return (200, b"Cache flushed.\n") if self.flush_ok else (400, b"Flush cache failed.\n")
        classes = {
            "/begin_weight_update": "BeginWeightUpdateReqInput", "/end_weight_update": "EndWeightUpdateReqInput",
            "/update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
            "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
            "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
            "/release_memory_occupation": "ReleaseMemoryOccupationReqInput",
            "/resume_memory_occupation": "ResumeMemoryOccupationReqInput",
        }
        if path not in classes:
            return 404, None
        validate_payload(payload, classes[path])
        if path == "/begin_weight_update":
            ok = not self.weight_session
            self.weight_session = True
            return (200 if ok else 400), {"success": ok, "message": "" if ok else "session already open"}
        if path == "/end_weight_update":
            ok = self.weight_session
            self.weight_session = False
            return (200 if ok else 400), {"success": ok, "message": ""}
        if path in ("/update_weights_from_tensor", "/update_weights_from_distributed"):
            if not self.weight_session:  # sglang 0.5.21: only inside begin/end_weight_update
                return 400, {"success": False, "message": f"{path} must run between begin and end"}
            if path == "/update_weights_from_tensor":
                from sglang.srt.utils.common import MultiprocessingSerializer

                self.received_tensors = [MultiprocessingSerializer.deserialize(b)
                                         for b in payload["serialized_named_tensors"]]
        if path in ("/release_memory_occupation", "/resume_memory_occupation"):
            return 200, None
        return 200, {"success": True, "message": "Success"}

    def generate(self, payload: dict) -> tuple[int, Any]:
        ids = payload.get("input_ids")
        if ids and isinstance(ids[0], list):
            return self.generate_batch(payload)
        rid = payload["rid"]
        logical = rid.split("#retry")[0]
        with self.lock:
            plan = self.status_plan.get(logical)
            if plan:
                status = plan.pop(0)
                return status, {"error": {"message": f"planned {status}"}}
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if logical in self.sleep_plan:
                time.sleep(self.sleep_plan[logical])
            return 200, self._run(payload)
        finally:
            with self.lock:
                self.in_flight -= 1

    def generate_batch(self, payload: dict) -> tuple[int, Any]:
        """SGLang's batch form, split per row as `GenerateReqInput.__getitem__` does; a planned status of any
        row answers the whole body (SGLang fails a batch as one request); rows run one after the other."""
        if self.refuse_batches:
            return 422, b"Failed to deserialize the JSON body into the target type: rid: invalid type: sequence"
        rows = []
        for i, ids in enumerate(payload["input_ids"]):
            row = {k: v for k, v in payload.items() if k not in ("rid", "input_ids", "sampling_params",
                                                                   "return_logprob", "custom_logit_processor")}
            row["rid"], row["input_ids"] = payload["rid"][i], ids
            row["sampling_params"] = payload["sampling_params"][i]
            row["return_logprob"] = payload["return_logprob"][i]
            processors = payload.get("custom_logit_processor")
            if processors and processors[i]:
                row["custom_logit_processor"] = processors[i]
            rows.append(row)
        with self.lock:
            for row in rows:
                plan = self.status_plan.get(row["rid"].split("#retry")[0])
                if plan:
                    status = plan.pop(0)
                    return status, {"error": {"message": f"planned {status}"}}
            self.batch_sizes.append(len(rows))
        return 200, [self._run(row) for row in rows]

    def _run(self, payload: dict) -> dict:
        # what SGLang's tokenizer manager does with the request, in the same order
        unknown = set(payload) - io_struct_fields("GenerateReqInput")
        if unknown:
            raise ValueError(f"unexpected fields {sorted(unknown)}")
        sp = SGLangSamplingParams(**payload["sampling_params"])
        sp.verify(VOCAB)
        sp = msgspec.msgpack.decode(msgspec.msgpack.encode(sp), type=SGLangSamplingParams)  # typed IPC
        ids = list(payload["input_ids"])
        req = FakeReq(payload["rid"], ids)
        processor = None
        custom = None
        if payload.get("custom_logit_processor"):
            processor = CustomLogitProcessor.from_str(payload["custom_logit_processor"])
            custom = (sp.custom_params or {}) | {"__req__": req}  # Req.__init__ injects the live Req
        with self.lock:
            cached = max((_common_prefix(ids, s) for s in self.radix), default=0)
            cached = min(cached, len(ids) - 1)
        logprobs = []
        reason = {"type": "length", "length": sp.max_new_tokens}
        ev = self.abort_events.get(payload["rid"])
        for step in range(sp.max_new_tokens):
            if ev is not None and ev.wait(0.05):
                reason = {"type": "abort", "message": "Abort in waiting queue", "status_code": None, "err_type": None}
                break
            gen = torch.Generator().manual_seed(hash(tuple(ids + req.output_ids)) % (2**31))
            logits = torch.randn(1, VOCAB, generator=gen) * 2
            logits[0, EOS] -= 3.0  # long enough responses
            if processor is not None:
                logits = processor(logits, [custom])
            lp = torch.log_softmax(logits[0], -1)
            draw = torch.Generator().manual_seed((sp.sampling_seed or 0) * 1000 + step)
            token = int(torch.multinomial(lp.exp(), 1, generator=draw))
            req.output_ids.append(token)
            logprobs.append([float(lp[token]), token, None])
            self.tokens_made[payload["rid"]] = len(req.output_ids)
            if token in (sp.stop_token_ids or set()):
                reason = {"type": "stop", "matched": token}
                break
        with self.lock:
            self.radix.append(ids + req.output_ids)
        meta = {"id": payload["rid"], "finish_reason": reason, "prompt_tokens": len(ids), "weight_version": "default",
                "completion_tokens": len(req.output_ids), "cached_tokens": cached}
        if payload.get("return_logprob"):
            meta["output_token_logprobs"] = logprobs
        return {"text": "", "output_ids": req.output_ids, "meta_info": meta}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.fixture
def fake():
    server = FakeSGLang()
    adapter.clear_registry()
    yield server
    server.close()
    adapter.clear_registry()


def client_for(fake: FakeSGLang, **kw) -> SGLangEngineClient:
    kw.setdefault("backoff_s", 0.01)
    return SGLangEngineClient(fake.url, kw.pop("timeout_s", 5.0), kw.pop("max_retries", 3), eos_token_id=EOS,
                              vocab_size=VOCAB, **kw)


def req(rid: str, ids: list[int], seed: int = 0, specs=None, **sampling) -> GenerateRequest:
    sampling.setdefault("max_new_tokens", 6)
    return GenerateRequest(rid=rid, input_ids=ids, sampling=SamplingParams(**sampling), seed=seed,
                           sampler_specs=list(specs or []))


# -- payloads ----------------------------------------------------------------------------------------
def test_io_struct_field_names_from_sglang_source():
    gen = io_struct_fields("GenerateReqInput")
    assert {"rid", "input_ids", "sampling_params", "return_logprob", "custom_logit_processor"} <= gen
    assert "custom_params" not in gen and "sampling_seed" not in gen  # those live in sampling_params
    assert {"rid", "abort_all"} <= io_struct_fields("AbortReq")  # rid comes from the BaseReq base
    assert {"serialized_named_tensors", "load_format", "flush_cache", "weight_version"} <= io_struct_fields(
        "UpdateWeightsFromTensorReqInput")
    assert {"names", "dtypes", "shapes", "group_name"} <= io_struct_fields("UpdateWeightsFromDistributedReqInput")


def test_payload_shape_and_validation(fake):
    client = client_for(fake)
    r = req("p1", [4, 5, 6], seed=17, specs=[{"kind": ClientScripted.kind}], temperature=0.7, top_p=0.9,
            stop_token_ids=[9])
    payload = client.build_payload(r)
    validate_generate_payload(payload, VOCAB)
    assert set(payload) == {"rid", "input_ids", "sampling_params", "return_logprob", "custom_logit_processor"}
    sp = payload["sampling_params"]
    assert sp["sampling_seed"] == 17 and sp["temperature"] == 0.7 and sp["top_p"] == 0.9
    assert sp["stop_token_ids"] == [9, EOS]  # a sampler's finish forces EOS: SGLang must stop on it
    assert sp["custom_params"]["seed"] == 17 and sp["custom_params"]["rid"] == "p1"
    assert type(CustomLogitProcessor.from_str(payload["custom_logit_processor"])) is adapter.SamplerLogitProcessor
    plain = client.build_payload(req("p2", [4]))
    assert "custom_logit_processor" not in plain and "custom_params" not in plain["sampling_params"]
    with pytest.raises(PayloadError, match="sampling_param"):
        validate_generate_payload({"rid": "x", "input_ids": [1], "sampling_param": {}})
    with pytest.raises(PayloadError, match="max_tokens"):
        validate_generate_payload({"rid": "x", "input_ids": [1], "sampling_params": {"max_tokens": 3}})
    with pytest.raises(PayloadError, match="top_p"):
        validate_generate_payload({"rid": "x", "input_ids": [1], "sampling_params": {"top_p": 0.0}})


def test_bad_sampling_key_fails_the_request_before_sending(fake, monkeypatch):
    client = client_for(fake)
    orig = SamplingParams.to_sglang
    monkeypatch.setattr(SamplingParams, "to_sglang", lambda self: {**orig(self), "max_tokens": 4})
    [res] = client.generate([req("bad", [1, 2])])
    assert res.finish_reason == "failed" and "max_tokens" in res.error
    assert fake.paths() == [] and client.metrics()["failed"] == 1


# -- generation --------------------------------------------------------------------------------------
def test_generate_with_samplers_end_to_end(fake):
    client = client_for(fake)
    specs = [{"kind": ClientScripted.kind}]
    r = req("g1", [7, 8, 9], seed=3, specs=specs, max_new_tokens=8)
    [res] = client.generate([r])
    assert res.finish_reason in ("stop", "length") and res.error is None
    assert res.output_ids[2] == 5 and 3 not in res.output_ids  # the processor ran inside the "server"
    assert res.prompt_len == 3 and len(res.logprobs) == len(res.output_ids)
    served = json.loads(json.dumps(fake.log[-1][1]))
    assert served["sampling_params"]["sampling_seed"] == 3
    # logprobs are the server's (after the processor): the forced token has logprob 0
    assert res.logprobs[2] == 0.0
    # annotations: replayed by the client == recorded by the processor in the server process
    hosted = adapter.annotations_for("g1", res.output_ids)
    assert res.annotations == hosted == replay_annotations(specs, 3, [7, 8, 9], res.output_ids, EOS, rid="g1")
    assert [a["n"] for a in res.annotations] == list(range(len(res.output_ids)))


def test_cached_tokens_metrics_and_order(fake):
    client = client_for(fake)
    [first] = client.generate([req("c1", [1, 2, 3, 4], max_new_tokens=5)])
    cont = [1, 2, 3, 4] + first.output_ids + [6]
    results = client.generate([req("c2", cont, max_new_tokens=3), req("c3", [2, 2], max_new_tokens=3)])
    assert [r.rid for r in results] == ["c2", "c3"]
    assert first.cached_tokens == 0
    assert results[0].cached_tokens == 4 + len(first.output_ids)  # prompt + previous response reused
    assert results[1].cached_tokens == 0
    m = client.metrics()
    prompt_total = 4 + len(cont) + 2
    assert m["requests"] == 3 and m["prompt_tokens"] == prompt_total
    assert m["cached_tokens"] == 4 + len(first.output_ids)
    assert m["prefix_cache_hit_rate"] == pytest.approx((4 + len(first.output_ids)) / prompt_total)
    assert m["generated_tokens"] == sum(len(r.output_ids) for r in [first, *results])


def test_a_samplers_forced_eos_reads_sampler_only_where_the_server_marks_it():
    """The project's server marks a sampler's finish (`"sampler": true` in the stop finish_reason): the
    client returns "sampler" as the embedded engine does; SGLang's plain matched stop stays "stop"."""
    client = SGLangEngineClient("http://127.0.0.1:9", eos_token_id=EOS, validate=False)

    def body(reason):
        return {"output_ids": [4, EOS], "meta_info": {"finish_reason": reason, "prompt_tokens": 2,
                                                      "output_token_logprobs": [[-1.0, 4, None], [-2.0, EOS, None]]}}

    r = req("f1", [2, 3])
    assert client._parse(r, body({"type": "stop", "matched": EOS, "sampler": True})).finish_reason == "sampler"
    assert client._parse(r, body({"type": "stop", "matched": EOS})).finish_reason == "stop"
    assert client._parse(r, body({"type": "length", "length": 2})).finish_reason == "length"


def test_a_samplers_finish_is_recomputed_from_sglangs_plain_stop():
    """SGLang reports a sampler's forced EOS as a matched stop: the client asks the replayed chain whether
    it would have finished at the last position ("sampler"), or whether the EOS was drawn ("stop")."""
    from sglang_patches.request_sampler import Sampler, StepAction, register_sampler

    @register_sampler
    class FinishAfter(Sampler):
        kind = "test_finish_after"

        def __init__(self, seed: int, n: int):
            super().__init__(seed)
            self.n = n

        def adjust(self, logits, partner_logits, view):
            return StepAction(finish=len(view.output_ids) >= self.n)

    client = SGLangEngineClient("http://127.0.0.1:9", eos_token_id=EOS, validate=False)
    body = {"output_ids": [4, EOS], "meta_info": {"finish_reason": {"type": "stop", "matched": EOS}, "prompt_tokens": 2,
                                                  "output_token_logprobs": [[-1.0, 4, None], [0.0, EOS, None]]}}

    def finish(n: int) -> str:
        r = GenerateRequest(f"fa{n}", [2, 3], SamplingParams(max_new_tokens=8), seed=1,
                            sampler_specs=[{"kind": "test_finish_after", "n": n}])
        return client._parse(r, body).finish_reason

    assert finish(1) == "sampler"  # after one token the sampler ends the request: its EOS
    assert finish(5) == "stop"  # the sampler would not have ended it: the model drew the EOS


def test_retries_after_two_503_then_success(fake):
    fake.status_plan["r503"] = [503, 503]
    client = client_for(fake)
    [res] = client.generate([req("r503", [1, 2])])
    assert res.finish_reason != "failed" and res.rid == "r503"
    assert [p["rid"] for path, p in fake.log if path == "/generate"] == ["r503", "r503#retry1", "r503#retry2"]
    m = client.metrics()
    assert m["retries"] == 2 and m["failed"] == 0


def test_a_full_server_queue_429_is_retried(fake):
    fake.status_plan["busy"] = [429]
    [res] = client_for(fake).generate([req("busy", [1, 2])])
    assert res.finish_reason != "failed"
    assert [p["rid"] for path, p in fake.log if path == "/generate"] == ["busy", "busy#retry1"]


def test_failure_after_retries_is_returned_and_counted(fake):
    fake.status_plan["down"] = [503] * 10
    fake.status_plan["bad"] = [400]
    client = client_for(fake, max_retries=2)
    res = client.generate([req("ok1", [1]), req("down", [2]), req("bad", [3]), req("ok2", [4])])
    assert [r.rid for r in res] == ["ok1", "down", "bad", "ok2"]
    assert [r.finish_reason == "failed" for r in res] == [False, True, True, False]
    assert "503" in res[1].error and "400" in res[2].error
    gens = [p["rid"].split("#")[0] for path, p in fake.log if path == "/generate"]
    assert gens.count("down") == 3 and gens.count("bad") == 1  # 4xx is not retried
    m = client.metrics()
    assert m["failed"] == 2 and m["retries"] == 2 and m["failure_rate"] == 0.5


def test_timeout_fails_the_request_and_aborts_it(fake):
    # the server would answer after 4 s; two 0.3 s attempts and their aborts end well before (the aborts' own deadline
    # is at least 2 s, so a loaded machine does not lose them: this test once failed so beside a training run)
    fake.sleep_plan["slow"] = 4.0
    client = client_for(fake, timeout_s=0.3, max_retries=1)
    t0 = time.perf_counter()
    [res] = client.generate([req("slow", [1, 2])])
    assert time.perf_counter() - t0 < 3.5
    assert res.finish_reason == "failed" and "timed out" in res.error
    aborted = [p["rid"] for path, p in fake.log if path == "/abort_request"]
    assert aborted == ["slow", "slow#retry1"]


def test_concurrency_cap(fake):
    fake.sleep_plan.update({f"q{i}": 0.1 for i in range(8)})
    client = client_for(fake, max_concurrency=3)
    res = client.generate([req(f"q{i}", [i + 2]) for i in range(8)])
    assert all(r.finish_reason != "failed" for r in res)
    assert fake.max_in_flight == 3


def test_abort_returns_partial_output(fake):
    fake.abort_events["long"] = threading.Event()
    client = client_for(fake)
    out: list = []
    t = threading.Thread(target=lambda: out.extend(client.generate([req("long", [1], max_new_tokens=1000)])))
    t.start()
    deadline = time.monotonic() + 10
    while fake.tokens_made.get("long", 0) < 2 and time.monotonic() < deadline:  # a fixed sleep lost under load
        time.sleep(0.02)
    client.abort("long")
    t.join(10)
    assert not t.is_alive()
    [res] = out
    assert res.finish_reason == "abort" and 0 < len(res.output_ids) < 1000
    assert client.metrics()["aborted"] == 1


def test_abort_during_retries_stops_retrying(fake):
    fake.status_plan["flaky"] = [503] * 20
    client = client_for(fake, max_retries=10, backoff_s=0.15, backoff_max_s=0.15)
    out: list = []
    t = threading.Thread(target=lambda: out.extend(client.generate([req("flaky", [1])])))
    t.start()
    time.sleep(0.2)
    client.abort("flaky")
    t.join(5)
    [res] = out
    assert res.finish_reason == "abort" and res.output_ids == [] and res.error is None
    attempts = [p for path, p in fake.log if path == "/generate"]
    assert 1 <= len(attempts) <= 3
    assert [p["rid"] for path, p in fake.log if path == "/abort_request"] == [attempts[-1]["rid"]]


# -- control routes -----------------------------------------------------------------------------------
def test_weight_updates_run_inside_a_session(fake):
    client = client_for(fake, tp_size=2)
    tensors = [("model.layers.0.mlp.up_proj.weight", torch.arange(6.0).reshape(2, 3)), ("lm_head.weight", torch.ones(2))]
    client.update_weights_from_tensor(tensors)
    assert fake.paths() == ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update"]
    assert len(fake.received_tensors) == 2  # one serialized copy per TP rank
    for copy in fake.received_tensors:
        assert [n for n, _ in copy] == [n for n, _ in tensors]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(copy, tensors))
    client.init_weights_update_group("10.0.0.1", 29500, 1, 3)
    client.update_weights_from_distributed(["lm_head.weight"], [torch.bfloat16], [torch.Size([2, 4])])
    body = fake.log[-2][1]
    assert fake.log[-2][0] == "/update_weights_from_distributed"
    assert body["dtypes"] == ["bfloat16"] and body["shapes"] == [[2, 4]] and body["group_name"] == "weight_update_group"
    assert fake.log[-4][1] == {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 3,
                               "group_name": "weight_update_group", "backend": "nccl"}
    with client.weight_update_session():  # explicit session: updates inside join it
        client.update_weights_from_distributed(["a"], ["float32"], [[1]])
        client.update_weights_from_distributed(["b"], ["float32"], [[1]])
    assert fake.paths()[-4:] == ["/begin_weight_update", "/update_weights_from_distributed",
                                 "/update_weights_from_distributed", "/end_weight_update"]


def test_flush_release_resume_and_errors(fake):
    client = client_for(fake, max_retries=0)
    client.flush_cache()
    client.release_memory_occupation()
    client.resume_memory_occupation(["kv_cache"])
    assert fake.paths() == ["/flush_cache", "/release_memory_occupation", "/resume_memory_occupation"]
    assert fake.log[-1][1] == {"tags": ["kv_cache"]}
    fake.flush_ok = False
    with pytest.raises(RuntimeError, match="400"):
        client.flush_cache()
    fake.weight_session = True  # begin refused: an error, not a silent success
    with pytest.raises(RuntimeError, match="session already open"):
        client.update_weights_from_distributed(["a"], ["float32"], [[1]])
    assert client.health()
    assert not SGLangEngineClient("http://127.0.0.1:9", 0.5, 0).health()


def test_connection_refused_is_a_failed_result():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SGLangEngineClient(f"http://127.0.0.1:{port}", 1.0, 2, backoff_s=0.01)
    [res] = client.generate([req("nobody", [1])])
    assert res.finish_reason == "failed" and res.error
    assert client.metrics()["retries"] == 2 and client.metrics()["failed"] == 1


def test_partner_sampler_rejected_before_sending(fake):
    class NeedsPartner(Sampler):
        kind = "test_sglang_client_partner"
        needs_partner = True

    if SAMPLER_REGISTRY.get(NeedsPartner.kind) is None:
        register_sampler(NeedsPartner)
    [res] = client_for(fake).generate([req("tandem", [1], specs=[{"kind": "test_sglang_client_partner"}])])
    assert res.finish_reason == "failed" and "test_sglang_client_partner" in res.error
    assert fake.paths() == []


# -- server command -------------------------------------------------------------------------------------
def _real_cli():
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    fields = {f.name for f in msgspec.structs.fields(ServerArgs)}
    return parser, fields


def test_server_command_flags_are_real_server_args():
    cfg = SGLangConfig(model_path="/models/qwen3", tp_size=4, mem_fraction_static=0.7,
                       extra_server_args=["--dp-size", "2", "--log-level=warning"])
    cmd = build_server_command(cfg, None, 30123, host="0.0.0.0", enable_memory_saver=True)
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    parser, fields = _real_cli()
    dest = {o: a.dest for a in parser._actions for o in a.option_strings}
    flags = [a.split("=")[0] for a in cmd[3:] if a.startswith("--")]
    assert all(dest[f] in fields for f in flags), [f for f in flags if dest.get(f) not in fields]
    args = parser.parse_args(cmd[3:])
    assert (args.model_path, args.tp_size, args.mem_fraction_static, args.port, args.host) == (
        "/models/qwen3", 4, 0.7, 30123, "0.0.0.0")
    assert args.enable_custom_logit_processor and args.disable_overlap_schedule and args.enable_memory_saver
    assert args.dp_size == 2 and args.log_level == "warning" and not args.skip_tokenizer_init
    off = build_server_command(SGLangConfig(model_path="/m", enable_custom_logit_processor=False), None, 1)
    assert "--enable-custom-logit-processor" not in off and "--disable-overlap-schedule" not in off


def test_lora_flags_parse_as_sglang_takes_them():
    """The adapter-sync engines' flags (`lora_sync.sglang_lora_args`, experts included) through SGLang's own
    parser: LoRA on, the rank, one adapter per batch, and target modules SGLang supports."""
    from sglang.srt.utils.common import SUPPORTED_LORA_TARGET_MODULES

    from slime_ext.engine.lora_sync import sglang_lora_args

    parser, fields = _real_cli()
    flags = sglang_lora_args(32, ("linear_qkv", "linear_proj", "experts"))
    args = parser.parse_args(["--model-path", "/m", *flags])
    assert args.enable_lora and args.max_lora_rank == 32 and args.max_loras_per_batch == 1
    assert sorted(args.lora_target_modules) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj",
                                                "v_proj"]
    assert set(args.lora_target_modules) <= set(SUPPORTED_LORA_TARGET_MODULES)
    assert {"enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch"} <= fields


def test_server_command_rejects_unknown_and_clashing_flags():
    with pytest.raises(ServerArgsError, match="--tp-sise"):
        build_server_command(SGLangConfig(model_path="/m", extra_server_args=["--tp-sise", "2"]), None, 1)
    with pytest.raises(ServerArgsError, match="--dp-size"):
        build_server_command(SGLangConfig(model_path="/m", extra_server_args=["--dp-size", "two"]), None, 1)
    with pytest.raises(ServerArgsError, match="--tensor-parallel-size"):  # alias of --tp-size, set from config
        build_server_command(SGLangConfig(model_path="/m", extra_server_args=["--tensor-parallel-size", "2"]), None, 1)
    with pytest.raises(ValueError, match="model path"):
        build_server_command(SGLangConfig(), None, 1)


def test_ast_fallback_reads_the_same_fields():
    from slime_ext.engine import sglang_launcher

    _, fields = _real_cli()
    ast_fields = sglang_launcher._ast_server_arg_fields()
    assert {f for f in fields if not f.startswith("_")} <= ast_fields
    assert {"tp_size", "mem_fraction_static", "enable_custom_logit_processor", "model_path"} <= ast_fields


# -- server lifecycle (a stand-in process: sglang itself needs a GPU) --------------------------------
FAKE_SERVER = textwrap.dedent("""
    import http.server, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(child.pid, flush=True)
    time.sleep(float(sys.argv[2]))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(") ")[1][0] != "Z"


def test_server_lifecycle_waits_for_health_and_kills_the_group(tmp_path):
    port = _free_port()
    log = tmp_path / "server.log"
    server = SGLangServer([sys.executable, "-c", FAKE_SERVER, str(port), "0.4"], port=port,
                          startup_timeout_s=20, poll_interval_s=0.1, log_path=str(log))
    with server:
        assert server.proc is not None and server.proc.poll() is None
        assert SGLangEngineClient(server.base_url, 2.0, 0).health()
        leader = server.proc.pid
        deadline = time.time() + 5
        while not log.read_text().strip() and time.time() < deadline:
            time.sleep(0.05)
        child = int(log.read_text().split()[0])
        assert _alive(child)
        assert server.env["SGLANG_RETURN_ORIGINAL_LOGPROB"] == "1"
    assert server.proc is None
    time.sleep(0.1)
    assert not _alive(leader) and not _alive(child)  # the whole process group is gone


def test_server_start_failures():
    port = _free_port()
    dead = SGLangServer([sys.executable, "-c", "import sys; sys.exit(3)"], port=port, poll_interval_s=0.05)
    with pytest.raises(RuntimeError, match="code 3"):
        with dead:
            pass
    silent = SGLangServer([sys.executable, "-c", "import time; time.sleep(30)"], port=port,
                          startup_timeout_s=0.5, poll_interval_s=0.05)
    with pytest.raises(TimeoutError, match="not healthy"):
        with silent:
            pass
    assert silent.proc is None
