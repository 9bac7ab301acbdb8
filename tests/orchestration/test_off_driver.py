"""Work that loads a whole model runs in a Ray worker on the driver's node: the driver never builds the model
(its in-process loader is made to fail here), and the worker's engine answers exactly as one in the driver."""

from __future__ import annotations

import os

from sglang_patches.decoding import SamplingParams
from slime_ext.data.generation import GenerateRequest
from tests.orchestration.test_one_method import local_ray  # noqa: F401 - one small local Ray (a module fixture)
from tests.serving.test_serve import model_dir  # noqa: F401 - the tiny served checkpoint (a module fixture)


def _worker_pid() -> int:
    return os.getpid()


def test_checkpoint_engines_and_final_evaluations_run_outside_the_driver(local_ray, model_dir, monkeypatch):
    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.orchestration.off_driver import checkpoint_engine, run_in_worker

    requests = [GenerateRequest(f"r{i}", [5 + i, 7, 9], SamplingParams(temperature=1.0, max_new_tokens=8), seed=i)
                for i in range(3)]
    here = EmbeddedEngine.from_pretrained(str(model_dir)).generate(requests)

    def no_model_in_the_driver(*args, **kwargs):
        raise AssertionError("the driver loaded a model")

    monkeypatch.setattr(EmbeddedEngine, "from_pretrained", classmethod(no_model_in_the_driver))
    with checkpoint_engine(model_dir) as engine:
        there = engine.generate(requests)
    assert [r.output_ids for r in there] == [r.output_ids for r in here]
    assert [r.logprobs for r in there] == [r.logprobs for r in here]
    assert run_in_worker(_worker_pid) != os.getpid()
