"""The exact command line of engine 0 for the plan: `sglang.launch_server` on GPU runs (validated against
sglang when it imports), the project's SGLang-protocol server on CPU runs, as the loop starts them."""

from __future__ import annotations

from typing import Optional

from slime_ext.config.schema import Config
from slime_ext.methods.registry import method_class

ENGINE_PORT = 30000


def engine_command(config: Config, warnings: list[str]) -> Optional[list[str]]:
    """Engine 0's exact `sglang.launch_server` argv (validated against sglang when it imports)."""
    from slime_ext.engine.sglang_launcher import build_server_command

    if config.rollout.engine != "sglang":
        return None
    model_path = config.sglang.model_path or config.model.hf_path
    if not model_path and "sft" in config.run.stages:
        model_path = "<the SFT warm start>"  # the loop starts the engines from the warm start's HF directory
    if not model_path:
        warnings.append("neither sglang.model_path nor model.hf_path is set: engine command shows a placeholder")
        model_path = "<model.hf_path>"
    host = "0.0.0.0" if config.sglang.num_engines > 1 else "127.0.0.1"
    from slime_ext.engine.engine_server import engine_dtype, server_command

    dtype = engine_dtype(config.rollout.precision)
    if config.cluster.gpus_per_node == 0:  # CPU run: the project's SGLang-protocol server, as the loop starts it
        partner = "<partner checkpoint>" if method_class(config).holds_partner(config) else None
        port = config.sglang.base_port or ENGINE_PORT
        return server_command(config.sglang, model_path, port, threads=config.rollout.threads,
                              partner_dir=partner, use_sglang=False, dtype=dtype)[0]
    saver = config.cluster.colocate and config.cluster.gpus_per_node > 0
    from slime_ext.engine.lora_sync import lora_server_args

    dtype_flag = (["--dtype", dtype] if dtype else []) + lora_server_args(config)
    try:
        return build_server_command(config.sglang, model_path, ENGINE_PORT, host, enable_memory_saver=saver) + dtype_flag
    except ImportError as exc:
        warnings.append(f"sglang is not importable here ({exc}): engine flags not validated")
        return build_server_command(config.sglang, model_path, ENGINE_PORT, host, enable_memory_saver=saver,
                                    validate=False) + dtype_flag
