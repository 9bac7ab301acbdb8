"""The server as an SGLang engine server in the RL loop: weight updates from disk, tensors and a
distributed group, weight versions, model info, the partner model, and updates never racing generation.

Disk and the small checks run against in-process servers; tensor and distributed updates (which must
cross process boundaries) and the `--partner` CLI run against one `python -m slime_ext.tools.serve`
subprocess shared by this module."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.sglang_client import SGLangEngineClient
from slime_ext.engine.sglang_http import HTTPStatusError
from slime_ext.serving import ServerState, serve
from tests.serving.server_process import free_port, server_process

REPO = Path(__file__).resolve().parents[2]
TANDEM = {"kind": "tandem", "p_senior": 0.5, "kappa": 2, "boundary_ids": [0]}


def _checkpoint(d: Path, seed: int, tokenizer_from: Path | None = None) -> Path:
    from transformers import AutoModelForCausalLM

    from slime_ext.tokenizer import train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    if tokenizer_from is None:
        tok = train_tokenizer(["Question: what is 1 + 2?\nAnswer: 3", "the cat sat on the mat 12 34"] * 40,
                              vocab_size=300, out_dir=d)
        vocab = len(tok)
    else:
        for f in tokenizer_from.iterdir():
            if "token" in f.name or f.name == "special_tokens_map.json":
                (d / f.name).write_bytes(f.read_bytes())
        vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=vocab, initializer_range=0.3)).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("policy"), seed=0)


@pytest.fixture(scope="module")
def partner_dir(tmp_path_factory, model_dir):
    return _checkpoint(tmp_path_factory.mktemp("partner"), seed=1, tokenizer_from=model_dir)


@contextlib.contextmanager
def in_process(model_dir, **kw):
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    state = ServerState(EmbeddedEngine.from_pretrained(str(model_dir)), load_tokenizer(model_dir), "tiny",
                        max_tokens=4, model_path=str(model_dir), **kw)
    srv = serve(state)
    try:
        yield srv, state
    finally:
        srv.shutdown()
        state.batcher.close()


def call(url: str, path: str, payload=None, method: str = "POST"):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def served(url: str, name: str) -> torch.Tensor:
    code, rows = call(url, "/get_weights_by_name", {"name": name, "truncate_size": 10 ** 6})
    assert code == 200, rows
    return torch.tensor(rows, dtype=torch.float32)


def VOCAB(url: str) -> int:  # noqa: N802
    return len(served(url, "lm_head.weight"))


def request(rid: str, seed: int = 3, specs=None) -> GenerateRequest:
    return GenerateRequest(rid, [5, 6, 7], SamplingParams(temperature=1.0, max_new_tokens=4), seed=seed,
                           sampler_specs=specs or [])


@pytest.fixture
def file_system_sharing():
    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    yield
    torch.multiprocessing.set_sharing_strategy(before)


# -- disk ------------------------------------------------------------------------------------------
def test_update_from_disk_sets_weights_and_version_and_keeps_both_on_a_bad_tensor(model_dir, tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from megatron_glue.checkpoint_io import save_hf_checkpoint

    with in_process(model_dir) as (srv, state):
        client = SGLangEngineClient(srv.url, eos_token_id=state.tokenizer.eos_token_id, max_retries=0)
        assert client.model_info()["weight_version"] == "default"
        model = state.engine.model
        torch.manual_seed(7)
        new = {k: v.detach() + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
        save_hf_checkpoint(tmp_path / "step1", AutoConfig.from_pretrained(model_dir), new)
        client.update_weights_from_disk(str(tmp_path / "step1"), weight_version="2")

        for name in ("model.embed_tokens.weight", "model.layers.1.mlp.experts.gate_up_proj", "lm_head.weight"):
            assert torch.equal(model.state_dict()[name], new[name]), name
        # the per-expert HF names of the saved files land in the fused expert tensors
        assert torch.equal(served(srv.url, "model.layers.0.mlp.experts.2.up_proj.weight"),
                           new["model.layers.0.mlp.experts.gate_up_proj"][2, 16:])
        info = client.model_info()
        assert info["weight_version"] == "2" and info["model_path"] == str(tmp_path / "step1")
        assert info["is_generation"] is True and info["model_type"] == "qwen3_moe"
        (res,) = client.generate([request("after-disk")])
        assert res.weight_version == "2" and res.finish_reason != "failed"

        # one unknown name among good tensors: refused, nothing applied, version unchanged
        before = {k: v.clone() for k, v in model.state_dict().items()}
        bad = tmp_path / "bad"
        bad.mkdir()
        save_file({"model.norm.weight": torch.zeros(32), "model.layers.0.self_attn.nope.weight": torch.zeros(2)},
                  str(bad / "model.safetensors"))
        with pytest.raises(HTTPStatusError) as err:
            client.update_weights_from_disk(str(bad), weight_version="3")
        assert err.value.status == 400 and "model.layers.0.self_attn.nope.weight" in err.value.body
        assert json.loads(err.value.body)["success"] is False
        save_file({"model.norm.weight": torch.zeros(31)}, str(bad / "model.safetensors"))  # wrong shape
        with pytest.raises(HTTPStatusError, match=r"model.norm.weight.*\(31,\)"):
            client.update_weights_from_disk(str(bad), weight_version="3")
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        assert client.weight_version() == "2" and client.model_info()["model_path"] == str(tmp_path / "step1")
        code, body = call(srv.url, "/update_weights_from_disk", {"model_path": str(tmp_path / "missing")})
        assert code == 400 and body["success"] is False and body["num_paused_requests"] == 0


# -- small routes ------------------------------------------------------------------------------------
def test_version_session_group_and_memory_routes(model_dir):
    with in_process(model_dir, weight_version="v0") as (srv, state):
        url = srv.url
        assert call(url, "/model_info", method="GET")[1]["weight_version"] == "v0"
        assert call(url, "/get_model_info", method="GET")[1]["served_model_name"] == "tiny"
        assert call(url, "/update_weight_version", {"new_version": "v1"}) == (
            200, {"success": True, "message": "Weight version updated to v1", "new_version": "v1"})
        code, body = call(url, "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}})
        assert code == 200 and body["meta_info"]["weight_version"] == "v1"
        # sessions as SGLang 0.5.21: tensor and distributed updates only inside one
        for path, payload in [("/update_weights_from_tensor", {"serialized_named_tensors": [""]}),
                              ("/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": []})]:
            code, body = call(url, path, payload)
            assert code == 400 and body["success"] is False and "begin_weight_update()" in body["message"]
        assert call(url, "/end_weight_update", {})[0] == 400
        assert call(url, "/begin_weight_update", {}) == (200, {"success": True, "message": "Success"})
        assert call(url, "/begin_weight_update", {})[1]["message"].startswith("a weight-update session is already open")
        code, body = call(url, "/update_weights_from_distributed", {"names": ["x"], "dtypes": ["float32"],
                                                                     "shapes": [[1]]})
        assert code == 400 and "init_weights_update_group" in body["message"]
        code, body = call(url, "/update_weights_from_tensor", {"serialized_named_tensors": ["gARdlC4="]})  # []
        assert code == 400 and "holds no tensors" in body["message"]
        assert call(url, "/end_weight_update", {})[0] == 200
        code, body = call(url, "/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1,
                                                              "rank_offset": 1, "world_size": 2, "backend": "nccl"})
        if not torch.cuda.is_available():
            assert code == 400 and "needs CUDA" in body["message"]
        assert call(url, "/destroy_weights_update_group", {})[1] == {
            "success": False, "message": "The group to be destroyed does not exist."}
        assert call(url, "/release_memory_occupation", {"tags": ["kv_cache"]}) == (200, None)
        assert call(url, "/resume_memory_occupation", None, method="GET") == (200, None)
        code, body = call(url, "/update_weights_from_disk", {"model_path": 5})
        assert code == 400 and body["error"]["param"] == "model_path"
        assert state.weight_version == "v1"


def test_tensor_payload_forms_and_refusals(model_dir, file_system_sharing):
    """sglang's flattened bucket is unpacked; payloads this server cannot or must not rebuild are refused
    with the reason: file descriptors (the sender's sharing strategy) and arbitrary globals."""
    import base64
    import io
    import pickle

    from sglang.srt.utils.common import MultiprocessingSerializer
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    def post(payload, load_format=None):
        return call(srv.url, "/update_weights_from_tensor", {"serialized_named_tensors": [payload],
                                                             "load_format": load_format, "weight_version": "b"})

    with in_process(model_dir) as (srv, state):
        assert call(srv.url, "/begin_weight_update", {})[0] == 200
        named = [("model.norm.weight", torch.randn(32)), ("model.layers.0.mlp.gate.weight", torch.randn(4, 32))]
        bucket = FlattenedTensorBucket(named_tensors=named)
        payload = {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}
        assert post(MultiprocessingSerializer.serialize(payload, output_str=True), "flattened_bucket")[0] == 200
        for name, t in named:
            assert torch.equal(state.engine.model.state_dict()[name], t)
        assert state.weight_version == "b"

        torch.multiprocessing.set_sharing_strategy("file_descriptor")
        code, body = post(MultiprocessingSerializer.serialize([("model.norm.weight", torch.ones(32))], output_str=True))
        assert code == 400 and "set_sharing_strategy('file_system')" in body["message"]

        class Evil:
            def __reduce__(self):
                return (os.system, ("true",))

        code, body = post(base64.b64encode(pickle.dumps([("model.norm.weight", Evil())])).decode())
        assert code == 400 and "blocked unsafe global" in body["message"]
        code, body = post(base64.b64encode(b"garbage").decode())
        assert code == 400 and "cannot deserialize" in body["message"]
        assert torch.equal(state.engine.model.state_dict()["model.norm.weight"], named[0][1])


def test_updates_wait_for_the_running_generate_call_and_version_its_results():
    """The update starts only after the running batch ends; that batch reports the old version, the next
    one the new version; generation resumes after the update."""
    from tests.serving.serve_stub import StubEngine

    class Engine(StubEngine):
        def __init__(self):
            super().__init__(delay_s=0.05)
            self.model = torch.nn.Linear(2, 2, bias=False)
            self.events: list[str] = []

        def generate(self, requests, on_token=None):
            self.events.append("generate-start")
            out = super().generate(requests, on_token)
            self.events.append("generate-end")
            return out

        def update_weights_from_tensor(self, named):
            self.events.append("update")
            for _, t in named:
                self.model.weight.data.copy_(t)

    engine = Engine()  # 50 ms per step
    state = ServerState(engine, engine.tokenizer, "stub", max_tokens=8)
    srv = serve(state)
    try:
        results = {}
        slow = threading.Thread(target=lambda: results.setdefault("slow", call(srv.url, "/generate", {
            "input_ids": [1], "sampling_params": {"max_new_tokens": 10}})))
        slow.start()
        while "generate-start" not in engine.events:
            time.sleep(0.005)
        state.weights.apply([("weight", torch.ones(2, 2))], "7", abort_all=False)  # blocks until the batch ends
        assert engine.events == ["generate-start", "generate-end", "update"]
        slow.join()
        assert results["slow"][1]["meta_info"]["weight_version"] == "default"
        code, body = call(srv.url, "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
        assert body["meta_info"]["weight_version"] == "7" and torch.equal(engine.model.weight, torch.ones(2, 2))
        # abort_all_requests: the running request is aborted (it reports the version it ran under)
        slow = threading.Thread(target=lambda: results.setdefault("aborted", call(srv.url, "/generate", {
            "input_ids": [1], "sampling_params": {"max_new_tokens": 30}})))
        slow.start()
        while engine.events.count("generate-start") < 3:
            time.sleep(0.005)
        state.weights.apply([("weight", torch.zeros(2, 2))], "8", abort_all=True)
        slow.join()
        meta = results["aborted"][1]["meta_info"]
        assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 30
        assert meta["weight_version"] == "7" and state.weight_version == "8"
    finally:
        srv.shutdown()
        state.batcher.close()


# -- a server process: tensors, a distributed group, the partner -------------------------------------
@pytest.fixture(scope="module")
def process_server(model_dir, partner_dir):
    with server_process("--model", str(model_dir), "--partner", str(partner_dir), "--weight-version", "1",
                        "--max-tokens", "4") as (url, _):
        yield url


def test_partner_samplers_run_in_a_partner_server(process_server, model_dir, partner_dir):
    """--partner: a tandem request (the client with native_partner=True) runs policy and partner in the
    server exactly as the embedded engine does in-process; a server without a partner refuses it."""
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tokenizer import load_tokenizer

    eos = load_tokenizer(model_dir).eos_token_id
    client = SGLangEngineClient(process_server, eos_token_id=eos, native_partner=True, max_retries=0)
    reqs = [request(f"t{i}", seed=20 + i, specs=[TANDEM]) for i in range(3)]
    remote = client.generate(reqs)
    assert all(r.finish_reason != "failed" for r in remote), [r.error for r in remote]
    assert client.weight_version() == "1"  # runs before the tests that update this server
    expected = EmbeddedEngine.from_pretrained(str(model_dir), partner_path=str(partner_dir)).generate(reqs)
    assert [r.output_ids for r in remote] == [r.output_ids for r in expected]
    assert [[a["author"] for a in r.annotations] for r in remote] == \
           [[a["author"] for a in r.annotations] for r in expected]
    assert len({a["author"] for r in remote for a in r.annotations}) == 2  # both models wrote tokens
    with in_process(model_dir) as (srv, _):
        (res,) = SGLangEngineClient(srv.url, eos_token_id=eos, native_partner=True, max_retries=0).generate(reqs[:1])
        assert res.finish_reason == "failed" and "partner" in res.error


def test_tensor_update_crosses_processes(process_server, file_system_sharing):
    client = SGLangEngineClient(process_server, max_retries=0)
    assert client.weight_version() == "1"
    code, body = call(process_server, "/update_weights_from_tensor", {"serialized_named_tensors": ["gARdlC4="]})
    assert code == 400 and "begin_weight_update()" in body["message"]  # outside a session
    torch.manual_seed(11)
    named = [("model.layers.1.mlp.experts.3.down_proj.weight", torch.randn(32, 16)),
             ("model.norm.weight", torch.randn(32).to(torch.bfloat16))]
    client.update_weights_from_tensor(named, weight_version="3")  # begin, update, end
    assert torch.equal(served(process_server, named[0][0]), named[0][1])
    assert torch.equal(served(process_server, "model.norm.weight"), named[1][1].float())
    assert client.weight_version() == "3"
    with pytest.raises(RuntimeError, match="matches no parameter"):
        client.update_weights_from_tensor([("model.nope", torch.zeros(1))], weight_version="9")
    assert client.weight_version() == "3"


def test_distributed_update_from_a_trainer_at_rank_0(process_server):
    """The trainer side uses SGLang's own `init_custom_process_group`, as with a real SGLang server."""
    from sglang.srt.utils.common import init_custom_process_group

    client = SGLangEngineClient(process_server, max_retries=0)
    port, group = free_port(), "weight_update_group"
    joined: dict = {}
    join = threading.Thread(target=lambda: joined.setdefault("r", client.init_weights_update_group(
        "127.0.0.1", port, rank_offset=1, world_size=2, group_name=group, backend="gloo")))
    join.start()
    time.sleep(0.3)  # the server now waits in the rendezvous: it must keep answering
    start = time.monotonic()
    assert client.health(timeout_s=2) and time.monotonic() - start < 1.0
    pg = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=0,
                                   group_name=group)
    join.join(timeout=30)
    assert not join.is_alive() and "r" in joined
    try:
        torch.manual_seed(12)
        tensors = {"model.layers.0.self_attn.q_proj.weight": torch.randn(32, 32),
                   "model.layers.0.mlp.experts.1.gate_proj.weight": torch.randn(16, 32).to(torch.bfloat16),
                   "lm_head.weight": torch.randn(VOCAB(process_server), 32)}
        names = list(tensors)
        sent: dict = {}
        update = threading.Thread(target=lambda: sent.setdefault("r", client.update_weights_from_distributed(
            names, [t.dtype for t in tensors.values()], [t.shape for t in tensors.values()], group,
            weight_version="4")))
        update.start()
        for t in tensors.values():  # in the announced order, from rank 0
            torch.distributed.broadcast(t, src=0, group=pg)
        update.join(timeout=30)
        assert not update.is_alive() and "r" in sent
        for name, t in tensors.items():
            assert torch.equal(served(process_server, name), t.float()), name
        assert client.weight_version() == "4"
        (res,) = client.generate([request("after-dist")])
        assert res.weight_version == "4"

        # load_format flattened_bucket: sglang's FlattenedTensorBucket, one uint8 broadcast
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

        flat = [("model.norm.weight", torch.randn(32)),
                ("model.layers.1.mlp.experts.0.up_proj.weight", torch.randn(16, 32).to(torch.bfloat16))]
        bucket = FlattenedTensorBucket(named_tensors=flat)
        body = {"names": [n for n, _ in flat], "dtypes": [str(t.dtype)[6:] for _, t in flat],
                "shapes": [list(t.shape) for _, t in flat], "group_name": group, "load_format": "flattened_bucket",
                "weight_version": "5"}
        update = threading.Thread(target=lambda: sent.update(flat=[call(process_server, "/begin_weight_update", {}),
                                                                   call(process_server, path, body),
                                                                   call(process_server, "/end_weight_update", {})]))
        path = "/update_weights_from_distributed"
        update.start()
        torch.distributed.broadcast(bucket.get_flattened_tensor(), src=0, group=pg)
        update.join(timeout=30)
        assert [code for code, _ in sent["flat"]] == [200, 200, 200], sent["flat"]
        for name, t in flat:
            assert torch.equal(served(process_server, name), t.float()), name
        assert client.weight_version() == "5"
        assert call(process_server, "/destroy_weights_update_group", {"group_name": group})[1]["success"] is True
    finally:
        torch.distributed.destroy_process_group(pg)
