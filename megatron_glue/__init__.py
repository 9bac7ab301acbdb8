"""Megatron-core glue: model providers, HF <-> Megatron weights, the trainer, the CPU compatibility layer."""

import logging as _logging
import warnings as _warnings

# Known-harmless notices, silenced once here because every process that trains imports this package first.
# Without Transformer Engine and Apex (always on CPU; on GPUs when only TE is missing) megatron-core warns at
# import time, once per module, that it falls back to torch implementations: six UserWarnings per job that
# say nothing the cluster docs do not (docs/cluster.md: TE and Apex are GPU-only, optional). Other warnings
# from megatron still print.
_warnings.filterwarnings("ignore", category=UserWarning,
                         message=r"(Transformer Engine and Apex are|Apex is) not installed\. Falling back to")
# Megatron-FSDP logs at INFO which backend it detected ("Using Megatron-FSDP without Transformer Engine",
# "Detected Megatron Core ..."); we do not use FSDP, so only its warnings and errors are kept.
_logging.getLogger("megatron.core.distributed.fsdp").setLevel(_logging.WARNING)
