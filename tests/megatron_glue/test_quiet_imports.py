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


def test_importing_the_package_installs_the_filters():
    """The default run's variant of the check below (slow: three fresh processes importing megatron-core): the
    filter of exactly those notices and the FSDP logger's level are in place once the package is imported."""
    import importlib
    import logging
    import warnings

    import megatron_glue

    fsdp = logging.getLogger("megatron.core.distributed.fsdp")
    level = fsdp.level
    with warnings.catch_warnings():  # run the package's import-time code again, as a first import does
        warnings.resetwarnings()
        fsdp.setLevel(logging.NOTSET)
        importlib.reload(megatron_glue)
        ours = [f for f in warnings.filters if f[0] == "ignore" and f[1] is not None
                and f[1].pattern == r"(Transformer Engine and Apex are|Apex is) not installed\. Falling back to"]
        assert len(warnings.filters) == 1 and ours and ours[0][2] is UserWarning
        assert fsdp.level == logging.WARNING
    fsdp.setLevel(level)


@pytest.mark.slow
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

