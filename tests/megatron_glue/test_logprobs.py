"""Chunked LM-head log-probs and entropy equal a full-vocabulary log-softmax in values and gradients (TP 1, 2),
for any chunk size, and never hold a [tokens, vocab] fp32 tensor."""

from __future__ import annotations

import pytest
import torch

from megatron_glue.logprobs import DEFAULT_CHUNK_MB, chunked_logprobs, tokens_per_chunk
from tests.distributed import run_ranks

N, H, V = 37, 16, 50  # 37 tokens: chunks of 8 leave a ragged last chunk


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.7
    targets = torch.randint(0, V, (N,), generator=g)
    a, b = torch.randn(N, generator=g), torch.randn(N, generator=g)  # upstream gradients of lp and entropy
    return hidden, weight, targets, a, b


def _reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
    logp = torch.log_softmax((hidden @ weight.t()).double(), -1)
    lp = logp.gather(1, targets[:, None]).squeeze(1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def _grads(fn, hidden, weight, targets, a, b, with_entropy=True):
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    lp, ent = fn(h, w, targets)
    loss = (lp * a).sum() + ((ent * b).sum() if with_entropy else 0.0)
    loss.backward()
    return lp.detach(), (ent.detach() if ent is not None else None), h.grad, w.grad


def _chunk_mb(tokens: int, vocab: int) -> float:
    return tokens * 4 * vocab / 2**20


@pytest.mark.parametrize("chunk_tokens", [1, 8, 37, 1000])
def test_values_and_gradients_equal_the_full_log_softmax(chunk_tokens):
    hidden, weight, targets, a, b = _inputs()
    mb = _chunk_mb(chunk_tokens, V)
    assert tokens_per_chunk(V, mb) == chunk_tokens
    got = _grads(lambda h, w, t: chunked_logprobs(h, w, t, True, mb), hidden, weight, targets, a, b)
    ref = _grads(lambda h, w, t: _reference(h, w, t), hidden, weight, targets, a, b)
    for name, x, y in zip(("logprobs", "entropy", "grad hidden", "grad weight"), got, ref):
        assert torch.allclose(x.double(), y.double(), rtol=1e-5, atol=1e-5), name
    # the closed form of one entry: d lp_i / d W_j = (1[j = t_i] - p_ij) h_i  (entropy gradient off)
    only_lp = _grads(lambda h, w, t: chunked_logprobs(h, w, t, False, mb), hidden, weight, targets,
                     torch.eye(N)[0], torch.zeros(N), with_entropy=False)
    p = torch.softmax(hidden[0] @ weight.t(), -1)
    expected = -(p[:, None] * hidden[0][None, :])
    expected[targets[0]] += hidden[0]
    assert torch.allclose(only_lp[3], expected, atol=1e-6)


def test_entropy_gradient_is_skipped_when_unused_and_values_stay():
    hidden, weight, targets, a, _ = _inputs(1)
    with_ent = _grads(lambda h, w, t: chunked_logprobs(h, w, t, True, _chunk_mb(5, V)), hidden, weight, targets, a,
                      torch.zeros(N))
    without = _grads(lambda h, w, t: chunked_logprobs(h, w, t, False, _chunk_mb(5, V)), hidden, weight, targets, a,
                     torch.zeros(N), with_entropy=False)
    assert without[1] is None
    for x, y in zip((with_ent[0], with_ent[2], with_ent[3]), (without[0], without[2], without[3])):
        assert torch.allclose(x, y, atol=1e-6)


def test_bf16_inputs_give_fp32_logprobs_close_to_the_fp32_reference():
    hidden, weight, targets, a, b = _inputs(2)
    lp, ent = chunked_logprobs(hidden.bfloat16(), weight.bfloat16(), targets, True, _chunk_mb(4, V))
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    ref_lp, ref_ent = _reference(hidden.bfloat16().float(), weight.bfloat16().float(), targets)
    assert torch.allclose(lp.double(), ref_lp, atol=0.1) and torch.allclose(ent.double(), ref_ent, atol=0.1)
    # gradients in bf16 (the weight's summed over chunks in fp32) against the fp32 reference's
    got = _grads(lambda h, w, t: chunked_logprobs(h, w, t, True, _chunk_mb(4, V)), hidden.bfloat16(),
                 weight.bfloat16(), targets, a, b)
    ref = _grads(lambda h, w, t: _reference(h, w, t), hidden.bfloat16().float(), weight.bfloat16().float(), targets,
                 a, b)
    for x, y in zip(got[2:], ref[2:]):
        assert x.dtype == torch.bfloat16
        assert (x.double() - y.double()).abs().max() < 0.02 * y.abs().max()


def test_default_chunk_bounds_fp32_logits_at_qwen3_vocabulary():
    assert tokens_per_chunk(151936, DEFAULT_CHUNK_MB) == 883  # 512 MiB / (4 B x 151,936)
    assert tokens_per_chunk(151936 // 4, DEFAULT_CHUNK_MB) == 3533  # TP 4 holds a quarter of the vocabulary
    assert tokens_per_chunk(10**9, 1.0) == 1


def test_peak_allocation_is_one_chunk_not_the_vocabulary():
    """Forward+backward over 512 tokens x 8192 vocabulary: a full fp32 logits copy is 16 MiB; chunks of 16
    tokens keep every extra allocation within a few 0.5 MiB chunks plus the inputs and their gradients."""
    from megatron_glue.memory_meter import PeakMemory

    n, h, v = 512, 32, 8192
    hidden = torch.randn(n, h, requires_grad=True)
    weight = (torch.randn(v, h) * 0.1).requires_grad_()
    targets = torch.randint(0, v, (n,))
    peaks = {}
    for name, fn in (("chunked", lambda: chunked_logprobs(hidden, weight, targets, True, _chunk_mb(16, v))),
                     ("full", lambda: _reference(hidden, weight, targets))):
        hidden.grad = weight.grad = None
        with PeakMemory("cpu") as meter:
            lp, ent = fn()
            (lp.sum() + ent.sum()).backward()
            del lp, ent
        peaks[name] = meter.growth_bytes
    peak = peaks["chunked"]
    chunk = 16 * v * 4
    fixed = 2 * (n * h + v * h) * 4  # grads of hidden and weight (and the fp32 accumulator of W's grad)
    assert peak < fixed + 6 * chunk, (peak, fixed, chunk)
    assert peak < n * v * 4 / 2  # far below one full fp32 logits copy
    assert peaks["full"] > 2 * n * v * 4  # the meter sees the reference's [tokens, vocab] copies


def _tp2_rank(rank: int, chunk_tokens: int) -> tuple:
    from megatron.core import parallel_state as mpu

    mpu.initialize_model_parallel(tensor_model_parallel_size=2)
    hidden, weight, targets, a, b = _inputs(3)
    half = V // 2
    mine = weight[rank * half:(rank + 1) * half]
    got = _grads(lambda h, w, t: chunked_logprobs(h, w, t, True, _chunk_mb(chunk_tokens, half)), hidden, mine,
                 targets, a, b)
    mpu.destroy_model_parallel()
    return got


@pytest.mark.parametrize("chunk_tokens", [6, 37])
def test_tensor_parallel_slices_equal_the_full_vocabulary(chunk_tokens):
    """TP 2: both ranks return the full-vocabulary values; each rank's weight gradient is its slice of the full
    one, and the input gradients of the two ranks sum to the full one (the head input's all-reduce)."""
    results = run_ranks(_tp2_rank, 2, chunk_tokens)
    hidden, weight, targets, a, b = _inputs(3)
    ref = _grads(lambda h, w, t: _reference(h, w, t), hidden, weight, targets, a, b)
    half = V // 2
    for rank, (lp, ent, gh, gw) in enumerate(results):
        assert torch.allclose(lp.double(), ref[0], atol=1e-5) and torch.allclose(ent.double(), ref[1], atol=1e-5)
        assert torch.allclose(gw.double(), ref[3][rank * half:(rank + 1) * half].double(), atol=1e-5)
    assert torch.allclose((results[0][2] + results[1][2]).double(), ref[2].double(), atol=1e-5)


def _head_rank(rank: int, sequence_parallel: bool) -> dict:
    """A Megatron column-parallel LM head, once as today's logits + log-softmax, once deferred + chunked."""
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_glue.logprobs import DeferredLMHead

    mpu.initialize_model_parallel(tensor_model_parallel_size=2)
    from megatron_glue import cpu_compat

    cpu_compat.apply()
    torch.manual_seed(3)
    config = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=2, tensor_model_parallel_size=2,
                               sequence_parallel=sequence_parallel, use_cpu_initialization=True)

    class Model(torch.nn.Module):  # the parts of GPTModel the deferred head touches
        def __init__(self):
            super().__init__()
            self.pre_process, self.share_embeddings_and_output_weights = False, False
            self.output_layer = tensor_parallel.ColumnParallelLinear(
                H, V, config=config, init_method=torch.nn.init.normal_, bias=False, gather_output=False,
                skip_bias_add=False)

    model = Model()
    hidden, _, targets, a, b = _inputs(4)
    s_len, batch = 18, 2  # [s, b, h] as the decoder hands it over; a batch of 2 makes the transpose matter
    rows = hidden[:s_len * batch].view(s_len, batch, H)
    targets = targets[:s_len * batch].view(batch, s_len)
    a, b = a[:s_len * batch].view(batch, s_len), b[:s_len * batch].view(batch, s_len)
    if sequence_parallel:  # each rank holds half of the sequence; the head gathers it
        rows = rows[rank * (s_len // 2):(rank + 1) * (s_len // 2)]
    head = DeferredLMHead(model)
    out = {}
    for mode in ("logits", "deferred"):
        x = rows.detach().clone().requires_grad_()
        model.output_layer.weight.grad = None
        if mode == "logits":
            logits, _ = model.output_layer(x)
            logits = logits.transpose(0, 1).contiguous()  # as GPTModel returns it
            from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as reduce

            z = logits.float()
            top = z.detach().max(-1, keepdim=True).values
            torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX, group=mpu.get_tensor_model_parallel_group())
            z = z - top
            half = V // 2
            local = targets - rank * half
            inside = (local >= 0) & (local < half)
            picked = reduce(torch.where(inside, z.gather(-1, local.clamp(0, half - 1).unsqueeze(-1)).squeeze(-1), 0.0))
            sum_exp = reduce(z.exp().sum(-1))
            expected = reduce((z.exp() * z).sum(-1))
            lp, ent = picked - sum_exp.log(), sum_exp.log() - expected / sum_exp
        else:
            with head.deferred():
                h, _ = model.output_layer(x)
            h = h.transpose(0, 1).contiguous()  # as GPTModel returns it (a non-contiguous gradient comes back)
            lp, ent = head.logprobs(h, targets, with_entropy=True)
        ((lp * a).sum() + (ent * b).sum()).backward()
        out[mode] = (lp.detach().view(-1), x.grad.clone(), model.output_layer.weight.grad.clone())
    mpu.destroy_model_parallel()
    return out


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_deferred_head_equals_the_column_parallel_head(sequence_parallel):
    for out in run_ranks(_head_rank, 2, sequence_parallel):
        for name, x, y in zip(("logprobs", "input grad", "weight grad"), out["deferred"], out["logits"]):
            assert torch.allclose(x, y, atol=1e-5), name
