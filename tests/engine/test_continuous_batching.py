"""Continuous batching in the embedded engine: requests admitted into a running batch between decode steps
give what they give alone, and each result is handed over when its row finishes."""

from __future__ import annotations

import pytest
import torch

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from slime_ext.engine.embedded import EmbeddedEngine
from tests.engine.test_embedded import full_forward_logprobs, make_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18], [20, 21, 22, 23, 24], [25, 26, 27]]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return make_model(0)


def make_requests(tag: str, count: int, lengths: list[int], group: int = 1) -> list[GenerateRequest]:
    """`count` requests, `group` samples per prompt, token limits cycling through `lengths`."""
    return [GenerateRequest(f"{tag}{i}", PROMPTS[(i // group) % len(PROMPTS)],
                            SamplingParams(temperature=1.0, max_new_tokens=lengths[i % len(lengths)]), seed=31 * i + 7)
            for i in range(count)]


class Arrivals:
    """An `admit` that hands over `waves[k]` before decode step `at[k]` (counted in admit calls)."""

    def __init__(self, waves: list[list[GenerateRequest]], at: list[int]):
        self.waves, self.at, self.calls = waves, at, 0
        self.admitted_at: dict[str, int] = {}

    def __call__(self, can_join) -> list[GenerateRequest]:
        self.calls += 1
        out = []
        for wave, step in zip(self.waves, self.at):
            if step == self.calls:
                assert all(can_join(r) for r in wave)
                out.extend(wave)
                self.admitted_at.update({r.rid: self.calls for r in wave})
        return out


def test_admitted_requests_generate_what_they_generate_alone(model):
    first = make_requests("a", 6, [3, 12, 20], group=2)
    later = make_requests("b", 5, [15, 4, 9])
    last = make_requests("c", 3, [6])
    arrivals = Arrivals([later, last], at=[3, 21])  # the second wave joins once every earlier row finished (step 20)
    finished: list[tuple[int, str]] = []
    engine = EmbeddedEngine(model, -1)  # no EOS: each row ends at its own token limit
    results = engine.generate(first, admit=arrivals, on_finish=lambda r: finished.append((arrivals.calls, r.rid)))

    assert [r.rid for r in results] == [r.rid for r in first + later + last]
    for req, res in zip(first + later + last, results):
        alone = EmbeddedEngine(model, -1).generate([req])[0]
        assert res.output_ids == alone.output_ids, req.rid
        assert len(res.output_ids) == req.sampling.max_new_tokens
        expected = full_forward_logprobs(model, req.input_ids, res.output_ids)
        assert max(abs(x - y) for x, y in zip(expected, res.logprobs)) < 1e-4, req.rid
    # each result was handed over in the step its row finished: the step it started + its length (- 1 when
    # it started with the call; an admitted row's first token comes from its own prefill, in the admit step)
    step_of = dict((rid, step) for step, rid in finished)
    assert sorted(step_of) == sorted(r.rid for r in results)
    for req in first:
        assert step_of[req.rid] == req.sampling.max_new_tokens, req.rid
    for req in later + last:
        assert step_of[req.rid] == arrivals.admitted_at[req.rid] + req.sampling.max_new_tokens - 1, req.rid
    assert engine.stats["requests"] == len(results)


def test_a_request_that_cannot_join_is_not_offered(model):
    """Routing recording is fixed when the batch starts: a request that asks for it waits for the next call;
    the hf kernel cannot merge rows, so nothing joins its batches."""
    plain = make_requests("p", 2, [4])
    routed = GenerateRequest("r", PROMPTS[0], SamplingParams(max_new_tokens=4), seed=1, return_routed_experts=True)
    seen: list[bool] = []

    def admit(can_join):
        seen.append(can_join(routed))
        return []

    EmbeddedEngine(model, -1).generate(plain, admit=admit)
    assert seen and not any(seen)
    seen.clear()
    EmbeddedEngine(model, -1, kernel="hf").generate(plain, admit=lambda cj: seen.append(cj(plain[0])) or [])
    assert seen and not any(seen)


def test_admission_after_the_batch_emptied_starts_fresh_rows(model):
    """When every running row has finished, an arrival starts a new batch in the same call."""
    first = make_requests("a", 2, [2])
    later = make_requests("b", 3, [5, 3, 7])
    arrivals = Arrivals([later], at=[3])  # the first rows finished in step 2: the batch is empty at admit 3
    results = EmbeddedEngine(model, -1).generate(first, admit=arrivals)
    assert [len(r.output_ids) for r in results] == [2, 2, 5, 3, 7]
    for req, res in zip(first + later, results):
        assert res.output_ids == EmbeddedEngine(model, -1).generate([req])[0].output_ids
