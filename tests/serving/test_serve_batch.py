"""Batched /generate (SGLang's batch form) on the project's server: rows answered in order as if sent one
by one, joined into one engine call, validated whole, and admitted with one slot per row taken at once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from slime_ext.serving.admission import Admission
from slime_ext.serving.errors import APIError
from tests.serving.serve_stub import StubEngine, running

ROWS = [[97, 98], [99], [100, 101, 102]]


def _single(c: httpx.Client, ids: list[int], seed: int, max_new: int, rid: str) -> dict:
    r = c.post("/generate", json={"rid": rid, "input_ids": ids, "return_logprob": True,
                                  "sampling_params": {"max_new_tokens": max_new, "sampling_seed": seed}})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_batch_is_answered_row_by_row_as_single_requests_and_runs_as_one_call():
    with running(StubEngine(), batch_window_s=0.0) as (srv, state, engine):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            singles = [_single(c, ids, 5 + i, 2 + i, f"s{i}") for i, ids in enumerate(ROWS)]
            calls = engine.calls
            r = c.post("/generate", json={
                "rid": ["b0", "b1", "b2"], "input_ids": ROWS, "return_logprob": [True, False, True],
                "sampling_params": [{"max_new_tokens": 2 + i, "sampling_seed": 5 + i} for i in range(3)]})
        assert r.status_code == 200, r.text
        batch = r.json()
        assert isinstance(batch, list) and len(batch) == 3
        assert engine.calls == calls + 1  # the rows joined one engine call
        for i, (one, row) in enumerate(zip(singles, batch)):
            assert row["output_ids"] == one["output_ids"] and len(row["output_ids"]) == 2 + i
            assert row["meta_info"]["id"] == f"b{i}" and row["meta_info"]["prompt_tokens"] == len(ROWS[i])
            assert ("output_token_logprobs" in row["meta_info"]) == (i != 1)
        assert state.admission.active == 0


def test_shared_fields_and_a_string_rid_apply_to_every_row():
    with running(StubEngine()) as (srv, _, _):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/generate", json={"rid": "g", "input_ids": ROWS[:2],
                                          "sampling_params": {"max_new_tokens": 3, "sampling_seed": 1}})
    assert r.status_code == 200, r.text
    rows = r.json()
    assert [row["meta_info"]["id"] for row in rows] == ["g_0", "g_1"]
    assert [len(row["output_ids"]) for row in rows] == [3, 3]


@pytest.mark.parametrize("body,needle", [
    ({"input_ids": ROWS, "sampling_params": [{"max_new_tokens": 2}, {"top_p": 0.0}, {}]}, "sampling_params[1]"),
    ({"input_ids": ROWS, "rid": ["a", "b"]}, "rids length mismatch"),
    ({"input_ids": ROWS, "rid": ["a", "b", "a"]}, "Duplicate request IDs"),
    ({"input_ids": ROWS, "sampling_params": [{}, {}]}, "2 entries for a batch of 3"),
    ({"input_ids": [[97], [-1]]}, "input_ids[1]"),
])
def test_a_bad_row_refuses_the_batch_naming_the_row_and_nothing_runs(body, needle):
    with running(StubEngine()) as (srv, state, engine):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/generate", json=body)
        assert r.status_code == 400 and needle in r.text, r.text
        assert engine.calls == 0 and state.admission.active == 0


def test_a_batch_larger_than_the_concurrency_limit_is_refused():
    with running(StubEngine(), max_concurrency=2) as (srv, state, engine):
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            r = c.post("/generate", json={"input_ids": ROWS})
        assert r.status_code == 400 and "--max-concurrency 2" in r.text
        assert engine.calls == 0 and state.admission.active == 0


def test_admission_takes_a_batchs_slots_together_in_arrival_order():
    async def scenario() -> list[str]:
        adm = Admission(max_concurrency=4, max_queue=8, queue_timeout_s=5)
        order: list[str] = []
        a = await adm.acquire()
        b = await adm.acquire(2)  # 3 of 4 taken
        assert adm.active == 3

        async def take(name: str, n: int) -> None:
            release = await adm.acquire(n)
            order.append(name)
            await asyncio.sleep(0.01)
            release()

        batch = asyncio.ensure_future(take("batch3", 3))
        await asyncio.sleep(0.01)
        single = asyncio.ensure_future(take("single", 1))  # one slot is free, but the batch came first
        await asyncio.sleep(0.01)
        assert order == [] and adm.waiting == 2 and adm.active == 3
        a()  # 2 free: still not enough for the batch
        await asyncio.sleep(0.01)
        assert order == [] and adm.active == 2
        b()
        await asyncio.gather(batch, single)
        assert adm.active == 0 and adm.waiting == 0
        return order

    assert asyncio.run(scenario()) == ["batch3", "single"]


def test_admission_refuses_a_batch_it_could_never_run():
    async def scenario() -> None:
        await Admission(max_concurrency=2, max_queue=8, queue_timeout_s=1).acquire(3)

    with pytest.raises(APIError, match="batch of 3"):
        asyncio.run(scenario())


def test_a_waiting_batch_that_times_out_lets_the_single_behind_it_in():
    async def scenario() -> bool:
        adm = Admission(max_concurrency=2, max_queue=8, queue_timeout_s=0.05)
        hold = await adm.acquire()
        batch = asyncio.ensure_future(adm.acquire(2))
        await asyncio.sleep(0)
        adm.queue_timeout_s = 5
        single = asyncio.ensure_future(adm.acquire())
        with pytest.raises(APIError):
            await batch  # times out after 50 ms: the single behind it fits and is granted
        release = await asyncio.wait_for(single, 1)
        release()
        hold()
        return adm.active == 0 and adm.waiting == 0

    assert asyncio.run(scenario())
