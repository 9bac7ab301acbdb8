"""The trainer's sleep (megatron_glue.trainer_sleep): the DDP buffers are emptied in place and refilled, and a
run that sleeps between steps trains to the same bits as one that does not."""

from __future__ import annotations

import pytest
import torch

from megatron_glue.trainer_sleep import TrainerSleep
from tests.megatron_glue.test_trainer import make_samples, make_trainer
from tests.megatron_fixtures import single_process_parallel_state


@pytest.fixture(scope="module", autouse=True)
def _parallel_state():
    single_process_parallel_state(seed=3)


def _params(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.module.named_parameters()}


def test_sleeping_between_steps_frees_the_buffers_and_changes_no_bit():
    awake, sleeper = make_trainer(), make_trainer()
    with torch.no_grad():  # the same starting weights
        for (_, a), (_, b) in zip(awake.model.module.named_parameters(), sleeper.model.module.named_parameters()):
            b.copy_(a)
    sleep = TrainerSleep(sleeper)
    buffers = list(sleeper.model.buffers) + list(sleeper.model.expert_parallel_buffers)
    numel = sum(p.numel() for p in sleeper.model.module.parameters())
    has_params = [b for b in buffers if b.param_data is not None]
    hand = 4 * numel * (1 + bool(has_params))  # fp32 grads (+ fp32 params when in a buffer)
    expected = sum(d.untyped_storage().nbytes() for b in buffers for d in (b.param_data, b.grad_data) if d is not None)
    assert hand <= expected <= 1.05 * hand  # the buffers hold them, padded to Megatron's bucket alignment
    for step in range(2):
        samples = make_samples(seed=step)
        awake.train_step(samples, kind="grpo")
        assert sleep.onload() == (expected if step else 0)  # nothing to bring back before the first step
        sleeper.train_step(samples, kind="grpo")
        assert sleep.offload() == expected  # the rollout's time: buffers emptied in place
        assert sleep.offload() == 0  # already asleep
        assert all(b.grad_data.untyped_storage().nbytes() == 0 for b in buffers)
        assert all(b.param_data.untyped_storage().nbytes() == 0 for b in has_params)
    sleep.onload()
    assert all(b.grad_data.untyped_storage().nbytes() > 0 for b in buffers)
    assert all(torch.equal(a, b) for a, b in zip(_params(awake).values(), _params(sleeper).values()))


def test_a_call_that_reaches_an_offloaded_rank_wakes_it_for_the_call_and_sends_it_back():
    """A restarted engine brought current mid-rollout pushes from offloaded ranks: the rank's calls bring the
    buffers back for themselves and offload again, rather than read emptied storage."""
    from slime_ext.orchestration.train_group import TrainWorker

    worker = TrainWorker.__new__(TrainWorker)  # the rank's methods around an in-process trainer
    worker.trainer, worker.weights_version = make_trainer(), None
    samples = make_samples(seed=5)
    awake = worker.compute_logprobs(samples)["logprobs"]
    assert worker.offload() > 0
    asleep = worker.compute_logprobs(samples)["logprobs"]
    assert awake.keys() == asleep.keys() and all(torch.equal(awake[k], asleep[k]) for k in awake)
    buffers = list(worker.trainer.model.buffers)
    assert worker._sleep.asleep and all(b.grad_data.untyped_storage().nbytes() == 0 for b in buffers)


def _buffer_storage(trainer) -> set[int]:
    buffers = list(trainer.model.buffers) + list(trainer.model.expert_parallel_buffers)
    return {d.untyped_storage().data_ptr() for b in buffers for d in (b.param_data, b.grad_data) if d is not None}


def test_lora_s_frozen_base_is_what_sleep_moves_beside_the_buffers():
    """DDP buffers only what trains: with LoRA the base weights sit outside every buffer, and the sleep moves them
    to the host with the optimizer state (on a GPU; here their selection), so a colocated LoRA rank frees its base.
    In full training every parameter is in a buffer and nothing else moves. A LoRA rank that sleeps between steps
    trains to the same bits."""
    from megatron_glue.lora import LoRASpec
    from megatron_glue.trainer_sleep import frozen_weights

    full = make_trainer()
    assert frozen_weights(full, _buffer_storage(full)) == []
    spec = LoRASpec(rank=4, alpha=8.0)
    awake, sleeper = make_trainer(lora=spec), make_trainer(lora=spec)
    with torch.no_grad():  # the same starting weights
        for (_, a), (_, b) in zip(awake.model.module.named_parameters(), sleeper.model.module.named_parameters()):
            b.copy_(a)
    frozen = frozen_weights(sleeper, _buffer_storage(sleeper))
    base = [p for n, p in sleeper.model.module.named_parameters() if n.rpartition(".")[2] not in ("lora_a", "lora_b")]
    assert len(frozen) == len(base) > 0 and all(any(f is p for p in base) for f in frozen)
    sleep = TrainerSleep(sleeper)
    adapters = sum(p.numel() for p in sleeper.model.module.parameters() if p.requires_grad)
    for step in range(2):
        samples = make_samples(seed=step)
        awake.train_step(samples, kind="grpo")
        sleep.onload()
        sleeper.train_step(samples, kind="grpo")
        moved = sleep.offload()
        assert 4 * adapters <= moved <= 8 * adapters * 1.05 + 4096  # the adapters' buffers only (no base on CPU)
    sleep.onload()
    assert all(torch.equal(a, b) for a, b in zip(_params(awake).values(), _params(sleeper).values()))
