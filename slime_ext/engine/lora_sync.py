"""Adapter-only refit (`train.lora.sync: adapter`): after each step the trainer ranks send the LoRA adapters, not
the merged model, and every rollout request names them.

The adapters are gathered to global rank 0 (megabytes: `megatron_glue.lora_export.gathered_adapter`), which sends
them to every engine as SGLang takes them: `/load_lora_adapter_from_tensors` with PEFT names and the
adapter_config.json as `config_dict`, one serialized copy per engine TP rank, under one name (`LORA_NAME`),
replacing the previous version (unloaded first). The embedded engine actor takes the same tensors by Ray. The
engines keep the base they started from; the driver sends control messages only, as for full weights.
"""

from __future__ import annotations

from typing import Any, Optional

LORA_NAME = "policy"  # the adapter every rollout request names (lora_path)


def push_lora_adapter(trainer: Any, target: Any) -> Optional[dict]:
    """Every rank calls it (collective gathers); global rank 0 sends and returns the sync's counts, the others
    None. `target`: the embedded engine actor (`kind == "embedded"`) or engine servers (`urls`, `tp_size`)."""
    from megatron_glue.lora_export import gathered_adapter, peft_config

    tensors = gathered_adapter(trainer)
    if tensors is None:
        return None
    return send_lora_adapter(tensors, peft_config(trainer.settings.lora, tensors), target)


def send_lora_adapter(tensors: dict[str, Any], config: dict, target: Any) -> dict:
    """The PEFT adapter `tensors` (with its adapter_config.json `config`) to `target`'s engines under `LORA_NAME`,
    replacing the version they hold (a restarted engine holds none); returns the sync's counts."""
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    if target.kind == "embedded":
        import ray

        ray.get(target.handle.load_lora_adapter.remote(LORA_NAME, config, list(tensors.items())),
                timeout=target.timeout_s)
    else:
        from slime_ext.engine.sglang_client import SGLangEngineClient
        from slime_ext.engine.weight_sync import ipc_device

        device = ipc_device()  # CUDA IPC handles on GPUs, file-name shared memory on CPU
        named = [(name, t.to(device)) for name, t in tensors.items()]
        for url in target.urls:
            client = SGLangEngineClient(url, timeout_s=target.timeout_s, tp_size=target.tp_size, max_retries=0,
                                        **target.client_kwargs)
            try:  # SGLang refuses a second adapter under a loaded name: the previous version goes first
                client.unload_lora_adapter(LORA_NAME)
            except Exception:  # noqa: BLE001 - nothing loaded yet (the first sync, a restarted engine)
                pass
            client.load_lora_adapter_from_tensors(LORA_NAME, config, named)
    return {"tensors": len(tensors), "bytes_sent": nbytes, "bytes_full": nbytes, "buckets": 1, "elements":
            sum(t.numel() for t in tensors.values())}


def adapter_name(cfg: Any) -> Optional[str]:
    """The adapter every request names when the engines get adapters, not weights (train.lora.sync), else None."""
    return LORA_NAME if cfg.train.lora.rank and cfg.train.lora.sync == "adapter" else None


def lora_server_args(cfg: Any) -> list[str]:
    """SGLang's LoRA flags when the engines serve the run's adapter, else none."""
    if adapter_name(cfg) is None:
        return []
    targets = tuple(cfg.train.lora.target_modules)
    if cfg.model.arch == "qwen3_moe":  # its MLPs are routed experts: adapted only under the target "experts"
        targets = tuple(t for t in targets if t not in ("linear_fc1", "linear_fc2"))
    return sglang_lora_args(cfg.train.lora.rank, targets)


def sglang_lora_args(rank: int, targets: tuple[str, ...]) -> list[str]:
    """SGLang's server flags for serving the run's adapter: LoRA on, its rank and HF target modules, one adapter."""
    from megatron_glue.lora_export import HF_MODULES

    modules = sorted({m for t in targets for m in HF_MODULES[t]})
    return ["--enable-lora", "--max-lora-rank", str(rank), "--lora-target-modules", *modules,
            "--max-loras-per-batch", "1"]


__all__ = ["LORA_NAME", "adapter_name", "lora_server_args", "push_lora_adapter", "send_lora_adapter",
           "sglang_lora_args"]
