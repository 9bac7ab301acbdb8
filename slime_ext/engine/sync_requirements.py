"""Whether this environment can run a config's weight-sync path, asked before any work starts.

Why: the `tensor` and `distributed` paths call the sglang package (its serializer and flattened buckets, its
process-group rendezvous) inside the trainer ranks, at the first sync, after the data, tokenizer and SFT
stages have run. A machine without it must be told at launch, with the command that installs it.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Optional


def missing_sync_package(config: Any) -> Optional[str]:
    """Why `config`'s weight-sync path cannot run here (None: it can)."""
    s = config.sglang
    if config.rollout.engine != "sglang" or s.weight_sync == "disk":
        return None
    if importlib.util.find_spec("sglang") is not None:
        return None
    return (f"sglang.weight_sync={s.weight_sync} ({s.weight_sync_reason(config.cluster.colocate)}) calls the sglang package in the trainer "
            f"ranks, and it is not installed in this environment: run `bash scripts/setup.sh` (on a machine without "
            f"CUDA it installs sglang without dependencies through scripts/install_sglang_cpu.sh), or set "
            f"sglang.weight_sync=disk")


__all__ = ["missing_sync_package"]
