"""LoRA on megatron-core's parallel linear layers (`megatron_glue.lora`): a column-parallel layer feeding a
row-parallel one (as q/k/v -> attention output, fc1 -> fc2), each with an adapter, at TP 1 and TP 2 with and
without sequence parallelism, against the plain formula y = x W^T + (alpha / r) x A^T B^T on whole matrices:
outputs, the input's gradient and every adapter gradient (the slice each rank holds; summed over ranks where
megatron-core's finalize_model_grads all-reduces a `sequence_parallel` parameter); the base weights get none."""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_ranks

IN, MID, OUT, R, S, BATCH = 8, 12, 6, 4, 6, 2
ALPHA1, ALPHA2 = 8.0, 2.0


def _whole(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _reference() -> dict[str, torch.Tensor]:
    """The plain formula on whole matrices, its gradients by autograd."""
    from megatron_glue.lora import _init_a

    w1, w2, x, g = _whole(1, MID, IN), _whole(2, OUT, MID), _whole(3, S, BATCH, IN), _whole(4, S, BATCH, OUT)
    a1, a2 = _init_a(R, IN, 11).requires_grad_(), _init_a(R, MID, 12).requires_grad_()
    b1, b2 = _whole(5, MID, R).requires_grad_(), _whole(6, OUT, R).requires_grad_()
    x = x.requires_grad_()
    y1 = x @ w1.T + (ALPHA1 / R) * (x @ a1.T) @ b1.T
    y2 = y1 @ w2.T + (ALPHA2 / R) * (y1 @ a2.T) @ b2.T
    (y2 * g).sum().backward()
    return {"y2": y2.detach(), "x": x.grad, "a1": a1.grad, "b1": b1.grad, "a2": a2.grad, "b2": b2.grad}


def _lora_rank(rank: int, tp: int, sequence_parallel: bool) -> dict:
    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_glue import cpu_compat
    from megatron_glue.lora import LoRALinear

    mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
    cpu_compat.apply()
    config = TransformerConfig(num_layers=1, hidden_size=IN, num_attention_heads=2, tensor_model_parallel_size=tp,
                               sequence_parallel=sequence_parallel, use_cpu_initialization=True)
    col = tensor_parallel.ColumnParallelLinear(IN, MID, config=config, init_method=torch.nn.init.normal_, bias=False,
                                               gather_output=False, skip_bias_add=False)
    row = tensor_parallel.RowParallelLinear(MID, OUT, config=config, init_method=torch.nn.init.normal_, bias=False,
                                            input_is_parallel=True, skip_bias_add=False)
    m, s = MID // tp, S // tp
    with torch.no_grad():
        col.weight.copy_(_whole(1, MID, IN)[rank * m:(rank + 1) * m])
        row.weight.copy_(_whole(2, OUT, MID)[:, rank * m:(rank + 1) * m])
    lora1, lora2 = LoRALinear(col, R, ALPHA1, seed=11), LoRALinear(row, R, ALPHA2, seed=12)
    start = {"a1_init": lora1.lora_a.detach().clone(), "a2_init": lora2.lora_a.detach().clone(),
             "b_zero": bool((lora1.lora_b == 0).all() and (lora2.lora_b == 0).all())}
    with torch.no_grad():  # a trained adapter: B no longer zero
        lora1.lora_b.copy_(_whole(5, MID, R)[rank * m:(rank + 1) * m])
        lora2.lora_b.copy_(_whole(6, OUT, R))
    x, g = _whole(3, S, BATCH, IN), _whole(4, S, BATCH, OUT)
    if sequence_parallel:
        x, g = x[rank * s:(rank + 1) * s], g[rank * s:(rank + 1) * s]
    x = x.clone().requires_grad_()
    y1, _ = lora1(x)
    y2, _ = lora2(y1)
    (y2 * g).sum().backward()
    out = {"y2": y2.detach(), "x": x.grad, "a1": lora1.lora_a.grad, "b1": lora1.lora_b.grad,
           "a2": lora2.lora_a.grad, "b2": lora2.lora_b.grad, **start,
           "base_grads": [p.grad for p in (col.weight, row.weight)],
           "trainable": sorted(n for n, p in torch.nn.ModuleDict({"c": lora1, "r": lora2}).named_parameters()
                               if p.requires_grad),
           "sp_marked": [getattr(p, "sequence_parallel", False) for p in (lora1.lora_a, lora1.lora_b,
                                                                           lora2.lora_a, lora2.lora_b)]}
    mpu.destroy_model_parallel()
    return out


@pytest.mark.parametrize("tp,sequence_parallel", [(1, False), (2, False), (2, True)])
def test_lora_forward_and_gradients_match_the_formula_on_whole_matrices(tp, sequence_parallel):
    from megatron_glue.lora import _init_a

    ref = _reference()
    outs = run_ranks(_lora_rank, tp, tp, sequence_parallel)
    m, s = MID // tp, S // tp
    close = dict(atol=1e-5, rtol=1e-5)
    for rank, out in enumerate(outs):
        seq = slice(rank * s, (rank + 1) * s) if sequence_parallel else slice(None)
        assert torch.allclose(out["y2"], ref["y2"][seq], **close)
        assert torch.allclose(out["x"], ref["x"][seq], **close)
        # B of the column layer split by rows like W, A of the row layer by columns like W
        assert torch.allclose(out["b1"], ref["b1"][rank * m:(rank + 1) * m], **close)
        assert torch.allclose(out["a2"], ref["a2"][:, rank * m:(rank + 1) * m], **close)
        # every layout draws the same adapter and starts with B = 0
        assert torch.equal(out["a1_init"], _init_a(R, IN, 11))
        assert torch.equal(out["a2_init"], _init_a(R, MID, 12)[:, rank * m:(rank + 1) * m])
        assert out["b_zero"] and out["base_grads"] == [None, None]
        assert out["trainable"] == ["c.lora_a", "c.lora_b", "r.lora_a", "r.lora_b"]
        assert out["sp_marked"] == ([True, False, False, True] if sequence_parallel else [False] * 4)
    # whole on every rank: A of the column layer, B of the row layer; with sequence parallelism each rank holds
    # its chunk's share, which finalize_model_grads all-reduces
    for name in ("a1", "b2"):
        if sequence_parallel:
            assert torch.allclose(sum(o[name] for o in outs), ref[name], **close)
        else:
            assert all(torch.allclose(o[name], ref[name], **close) for o in outs)


def test_a_new_adapter_leaves_the_output_alone_and_merges_into_the_weight():
    from megatron.core import tensor_parallel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_glue.lora import LoRALinear
    from tests.megatron_fixtures import single_process_parallel_state

    single_process_parallel_state()
    config = TransformerConfig(num_layers=1, hidden_size=IN, num_attention_heads=2, use_cpu_initialization=True)
    col = tensor_parallel.ColumnParallelLinear(IN, MID, config=config, init_method=torch.nn.init.normal_, bias=False,
                                               gather_output=False, skip_bias_add=False)
    lora = LoRALinear(col, R, ALPHA1, seed=3)
    x = _whole(7, S, BATCH, IN)
    assert torch.equal(lora(x)[0], col(x)[0])  # B = 0
    with torch.no_grad():
        lora.lora_b.copy_(_whole(8, MID, R))
    merged = x @ lora.merged_weight_shard().T
    assert torch.allclose(lora(x)[0], merged, atol=1e-5)
    with pytest.raises(TypeError, match="not Linear"):
        LoRALinear(torch.nn.Linear(2, 2), R, ALPHA1)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        LoRALinear(col, 0, ALPHA1)
