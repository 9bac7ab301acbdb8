"""benchmarks/profile_phases.py: op categories, the time breakdown of a real profile, and the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.profile_phases import category_of, op_breakdown, write


def test_categories():
    assert category_of("aten::mm") == category_of("aten::_grouped_mm") == "matmul"
    assert category_of("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert category_of("aten::topk") == category_of("aten::index_add_") == "moe routing/dispatch"
    assert category_of("aten::index_select") == "moe routing/dispatch" and category_of("aten::indexx") == "other ops"
    assert category_of("aten::mul") == "other ops"


def test_breakdown_of_a_real_profile_adds_up_to_the_wall_time():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    import time

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(20):
            torch.softmax(a @ b, dim=-1).mul_(2.0)
        wall = time.perf_counter() - start
    out = op_breakdown(prof, wall)
    assert abs(sum(out["op_seconds"].values()) - max(wall, sum(v for k, v in out["op_seconds"].items()
                                                               if k != "framework/python"))) < 1e-9
    assert out["op_seconds"]["matmul"] > 0 and out["op_seconds"]["attention"] > 0  # softmax counts as attention
    assert out["top_ops"][0]["op"] in ("aten::mm", "aten::_softmax", "aten::mul_")
    assert {o["op"] for o in out["top_ops"]} >= {"aten::mm", "aten::_softmax"}
    assert next(o for o in out["top_ops"] if o["op"] == "aten::mm")["calls"] == 20


def test_report_tables(tmp_path):
    phase = {"seconds": 2.0, "tokens": 1000, "tokens_per_s": 500.0, "gflop": 10.0, "gflop_per_s": 5.0,
             "efficiency": 0.05, "profiled_seconds": 2.2,
             "shares": {"matmul": 0.4, "attention": 0.1, "moe routing/dispatch": 0.05, "other ops": 0.25,
                        "framework/python": 0.2},
             "top_ops": [{"op": "aten::mm", "self_s": 0.8, "calls": 10}]}
    report = {"meta": {"command": "x", "date": "d", "processor": "cpu", "cpu_count": 2, "torch": "t", "threads": 1},
              "roofline": {"matmul_gflop_per_s": 90.0, "copy_gb_per_s": 15.0,
                           "forward_gflop_per_token_at_context_117": 0.00233, "train_gflop_per_token_seq_117": 0.0066},
              "phases": {"sft": phase}}
    write(report, tmp_path)
    text = (tmp_path / "phases.md").read_text()
    assert "| sft | 2.00 | 1000 | 500 | 10.0 | 5.0 | 5% | 40% | 10% | 5% | 25% | 20% |" in text
    assert "| `aten::mm` | 0.800 | 10 |" in text and "90.0 GFLOP/s" in text


@pytest.mark.slow
def test_the_script_runs_at_a_small_scale(tmp_path):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "profile_phases.py"), "--scale", "0.03",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    report = json.loads((tmp_path / "phases.json").read_text())
    assert set(report["phases"]) == {"sft", "rollout", "rl"}
    for phase in report["phases"].values():
        assert phase["tokens"] > 0 and 0 < phase["efficiency"] < 1
        assert abs(sum(phase["shares"].values()) - 1) < 0.25  # op self times can overlap the wall slightly
