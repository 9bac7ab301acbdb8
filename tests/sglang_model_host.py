"""One engine TP rank of SGLang's own Qwen3-MoE model on CPU, fed `/update_weights_from_tensor` bodies.

Run as a subprocess by tests/engine/test_sglang_model_contract.py, one process per engine TP rank (gloo):

    python tests/sglang_model_host.py --config cfg.json --bodies bodies.json --tp-size 2 --tp-rank 0 \
        --port 29xxx --dtype bfloat16 --out rank0.pt

Each body is the JSON an `/update_weights_from_tensor` request carries (what our weight-sync wire built). The
rank takes its own entry exactly as SGLang's TP worker does (`TpModelWorker.deserialize_own_rank`) and applies
it with SGLang's own `WeightUpdater.update_weights_from_tensor` (flattened bucket -> the model's
`load_weights`). Every parameter starts as NaN, so an element no body reaches shows up. The loaded
parameters are saved to `--out` by SGLang's names.

Building the model needs SGLang's process-wide parallel context (as its `test/layer_ut_utils.py` sets it up)
and stand-ins for two packages it imports but this path never runs: torchvision (multimodal configs) and
sgl_kernel (the CPU engine's kernels, used only in forward).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from typing import Any

STUBBED = ("torchvision", "sgl_kernel")


class _Anything:
    """Whatever a stubbed module is asked for: callable, subclassable, with any attribute."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> "_Anything":
        return self

    def __getattr__(self, name: str) -> "_Anything":
        return _Anything()

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # type: ignore[attr-defined]


def install_stubs() -> None:
    import transformers.utils.import_utils  # noqa: F401 - reads torchvision's version before the stand-in exists

    sys.meta_path.insert(0, _StubFinder())


def build_model(config_dict: dict, tp_size: int, tp_rank: int, dtype: str) -> Any:
    """SGLang's Qwen3MoeForCausalLM for one TP rank of a `tp_size` engine, every parameter NaN."""
    import torch
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs
    from transformers import Qwen3MoeConfig

    init_distributed_environment(world_size=tp_size, rank=tp_rank, local_rank=tp_rank, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path="dummy", tp_size=tp_size), role="test", ranks=SpawnRanks(world_rank=tp_rank))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    initialize_model_parallel(backend="gloo")  # the sizes come from the published ServerArgs
    torch.set_default_dtype(getattr(torch, dtype))
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**config_dict))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(float("nan"))
    return model


def apply_bodies(model: Any, bodies: list[dict], tp_rank: int) -> None:
    """Each body through SGLang's own TP-worker and weight-updater code, as the engine's rank `tp_rank`."""
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(tp_rank=tp_rank))
    def unused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a tensor update must not need the model runner")

    updater = WeightUpdater(tp_rank=tp_rank, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={},
                            get_model=lambda: model, update_model_fields=unused, recapture_cuda_graph=unused,
                            get_model_runner=unused)
    for body in bodies:
        data = TpModelWorker.deserialize_own_rank(worker, body["serialized_named_tensors"])
        ok, message = updater.update_weights_from_tensor(data, load_format=body["load_format"])
        if not ok:
            raise RuntimeError(message)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--bodies", required=True)
    parser.add_argument("--tp-size", type=int, required=True)
    parser.add_argument("--tp-rank", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.update({"SGLANG_USE_CPU_ENGINE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(args.port)})
    install_stubs()
    import torch

    torch.set_num_threads(1)
    model = build_model(json.loads(open(args.config).read()), args.tp_size, args.tp_rank, args.dtype)
    apply_bodies(model, json.loads(open(args.bodies).read()), args.tp_rank)
    torch.save({name: p.detach().clone() for name, p in model.named_parameters()}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
