"""benchmarks/gpu/run_kit.py --dry: every section runs on the CPU and reports numbers (CI's check of the kit)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_dry_run_reports_every_section(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "run_kit.py"), "--dry", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "kit.json").read_text())
    assert report["meta"]["dry"] is True and report["meta"]["device"] == "cpu"
    sections = report["sections"]
    assert set(sections) == {"train", "decode", "grpo_quick"} and all(s["ok"] for s in sections.values())
    train = sections["train"]
    for key in ("megatron_glue", "hf_transformers"):
        assert train[key]["tokens_per_s"] > 0 and train[key]["tflop_per_s"] > 0 and train[key]["mfu"] is None
    assert math.isfinite(train["ratio_megatron_over_hf"]) and train["ratio_megatron_over_hf"] > 0
    for workload in ("fixed", "ragged"):
        r = sections["decode"][workload]
        assert r["embedded_tokens_per_s"] > 0 and r["hf_generate_tokens_per_s"] > 0
        assert math.isclose(r["ratio"], r["embedded_tokens_per_s"] / r["hf_generate_tokens_per_s"], rel_tol=1e-9)
    assert sections["grpo_quick"]["checked"] == "configs/grpo_quick.yaml"
    text = (tmp_path / "kit.md").read_text()
    assert "## Train step" in text and "## Decode" in text and "| fixed |" in text


def test_a_failing_section_is_recorded_and_the_others_run(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu import run_kit

    def boom() -> dict:
        raise RuntimeError("no such kernel")

    failed = run_kit.run_section("x", boom)
    assert failed["ok"] is False and failed["error"] == "RuntimeError: no such kernel" and "boom" in failed["traceback"]
    fine = run_kit.run_section("y", lambda: {"value": 3})
    assert fine == {"ok": True, "value": 3, "section_seconds": fine["section_seconds"]}
    text = run_kit.markdown({"dry": True, "command": "c", "date": "d", "gpu": None, "device": "cpu", "torch": "t",
                             "python": "p"}, {"x": failed})
    assert "## x: FAILED" in text and "no such kernel" in text


@pytest.mark.slow  # 22 s; the dry run above times both trainers in this process with the same code
def test_trainers_in_child_processes_report_like_in_process_and_a_failed_trainer_is_recorded(monkeypatch):
    """The GPU path times each trainer in its own process; on the CPU the same code runs at toy sizes."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.gpu import run_kit

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = run_kit.section_train(True, "cpu", separate_processes=True)
    assert out["separate_processes"] is True
    for key in run_kit.TRAINERS:
        assert "error" not in out[key], out[key]
        assert out[key]["tokens_per_step"] == sum(s.total_len for s in _toy_samples(run_kit))
        assert out[key]["tokens_per_s"] > 0 and out[key]["tflop_per_s"] > 0
    assert math.isclose(out["ratio_megatron_over_hf"],
                        out["megatron_glue"]["tokens_per_s"] / out["hf_transformers"]["tokens_per_s"], rel_tol=1e-9)

    def hf_fails(*_: object) -> dict:
        raise MemoryError("out of memory")

    monkeypatch.setattr("benchmarks.train_step.time_hf", hf_fails)
    half = run_kit.section_train(True, "cpu")
    assert half["hf_transformers"] == {"error": "MemoryError: out of memory"} and "ratio_megatron_over_hf" not in half
    assert half["megatron_glue"]["tokens_per_s"] > 0
    assert "| hf_transformers | failed: MemoryError" in run_kit.markdown(
        {"dry": True, "command": "c", "date": "d", "gpu": None, "device": "cpu", "torch": "t", "python": "p"},
        {"train": {"ok": True, **half}})


def _toy_samples(run_kit):
    from benchmarks import train_step as ts

    return ts.make_samples(run_kit._train_preset(True, "cpu"))
