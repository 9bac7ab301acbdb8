"""benchmarks/server_path.py in dry mode (tiny model, 4 x 2 requests of <= 8 tokens, 1 repeat): it runs
end to end (in-process engine, one real engine server, every weight-sync method) and writes the JSON and
Markdown reports. The 2-server and traced-server parts are left out here (two more server starts);
the committed report has them. A `--slow` check (~33 s on a 2-core machine, mostly process and server start-up):
the parts it runs have their own tests (tests/engine/test_server_pool.py, tests/serving/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_writes_the_reports(tmp_path):
    argv = [sys.executable, str(ROOT / "benchmarks/server_path.py"), "--dry-run", "--servers", "1", "--no-profile",
            "--load-requests", "6", "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=str(ROOT), capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "server_path.json").read_text())
    assert data["meta"]["dry_run"] and data["meta"]["command"].startswith("python benchmarks/server_path.py")
    assert {"date", "cpu", "cpu_count", "threads", "client_max_concurrency"} <= set(data["meta"])
    assert data["workload"]["requests"] == 8
    assert set(data["throughput"]) == {"in_process", "server_1"}
    for side in data["throughput"].values():
        assert side["tokens_per_s"] > 0 and side["generated_tokens"] > 0 and side["seconds"] > 0
    assert set(data["ratios"]) == {"server_1"} and all(r > 0 for r in data["ratios"].values())
    # same seeds, same weights: the server path generates the in-process engine's tokens
    assert data["same_tokens"] == {"server_1": 1.0}
    assert set(data["sync"]) == {"disk", "tensor", "distributed"}
    for v in data["sync"].values():
        assert v["push_s"] > 0 and v["commit_s"] > 0
    assert set(data["shares"]) == {"embedded", "disk", "tensor", "distributed"}
    assert all(0 < v["share"] < 1 for v in data["shares"].values())
    assert data["step"]["time_step_s"] > 0 and "committed" in data["step"]["source"]
    assert isinstance(data["targets"]["server_1_within_15pct"], bool)
    load = data["load"]["server_1"]  # every request's completion time, in order
    assert load["requests"] == 6 and len(load["completions_s"]) == 6 and load["completions_s"] == sorted(load["completions_s"])
    assert 0 < load["p10_s"] <= load["p50_s"] <= load["p90_s"] <= load["max_s"] <= load["seconds"]
    md = (tmp_path / "server_path.md").read_text()
    assert "## Latency under load" in md
    assert "| server_1 |" in md and "| distributed |" in md
