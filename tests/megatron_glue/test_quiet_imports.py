"""Megatron-core's known-harmless fallback notices are silenced at their source (megatron_glue/__init__.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

IMPORTS = ("import megatron.core.optimizer, megatron.core.optimizer.clip_grads; "
           "from megatron.core.models.gpt import gpt_layer_specs; "
           "import megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision")
CODE = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
        "{first}" + IMPORTS)


def _stderr(first: str) -> str:
    return subprocess.run([sys.executable, "-W", "default", "-c", CODE.format(first=first)], capture_output=True,
                          text=True, timeout=240, check=True).stderr


@pytest.mark.timeout(300)
def test_megatron_fallback_notices_are_silenced_and_other_output_is_not():
    loud = _stderr("")
    # without our package: the six TE/Apex fallback warnings (and FSDP's INFO lines) print
    assert loud.count("UserWarning") == 6 and "not installed" in loud
    quiet = _stderr("import megatron_glue; ")
    assert "not installed" not in quiet and "Megatron-FSDP" not in quiet
    # only those: a different UserWarning still prints
    other = subprocess.run([sys.executable, "-c", "import megatron_glue, warnings; warnings.warn('keep me')"],
                           capture_output=True, text=True, timeout=120).stderr
    assert "keep me" in other

