"""The GPU weight-sync check (`benchmarks/gpu/weight_sync_gpu.py`) in its CPU dry mode: every section runs on tiny
shapes (gloo in place of NCCL), so the script cannot rot between GPU sessions."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_dry_run_moves_and_verifies_every_tensor(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu/weight_sync_gpu.py"), "--dry", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sections = json.loads((tmp_path / "weight_sync_gpu.json").read_text())["sections"]
    nccl, ipc, delta = sections["nccl"], sections["ipc"], sections["delta"]
    assert nccl["backend"] == "gloo" and [r["checksum_failures"] for r in nccl["ranks"]] == [0, 0]
    assert ipc["verified"] == 1 + 2 * (6 + 4 * 3) + 2  # embedding, 2 layers of 6 + 4 experts x 3, norm, head
    assert ipc["pipe_bytes"] < ipc["weight_bytes"]  # handles and file names travel, not the weights
    assert all(0 < s["changed_share"] < 1 for s in delta["steps"]) and delta["ok"]
