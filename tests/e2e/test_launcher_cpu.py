"""The cluster launcher, run for real on this CPU machine: `scripts/run-qwen3-30B-A3B.sh --cpu` composes the
config from the checkpoint, prints the plan, and execs the driver, which trains a TP=2 / EP=2 gloo trainer
for 3 RL steps from a tiny HF checkpoint and evaluates it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slime_ext.studies import read_metrics
from tests.conftest import REPO
from tests.e2e.hf_checkpoint import make_tiny_hf_checkpoint, read_hf_weights, write_math_data

# The rollout engines of the launched run: two engine server processes (the project's SGLang-protocol
# server on CPU) behind sglang-router, weights synced over a gloo group after every step.
ENGINE = ["rollout.engine=sglang", "sglang.num_engines=2", "sglang.router=true", "sglang.weight_sync=distributed"]
STEPS = 3
LAYOUT = [  # 2 gloo trainer ranks (DP 1: local-cpu.yaml's two DP ranks would make 4); MoE with TP needs sequence
    # parallel, and ETP 1 keeps EP x ETP within 2 ranks
    "train.parallel.tensor_model_parallel_size=2", "train.parallel.expert_model_parallel_size=2",
    "train.parallel.expert_tensor_parallel_size=1", "train.parallel.sequence_parallel=true",
    "train.parallel.data_parallel_size=1",
]


def run_launcher(tmp: Path, ckpt: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`bash scripts/run-qwen3-30B-A3B.sh --cpu` with this interpreter's venv, no setup, and the run's files
    under `tmp`. On a timeout the whole process group (the driver and its local Ray) is killed."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DRY_RUN", "CPU_RUN", "METHOD_CONFIG", "MODEL_CONFIG", "NNODES", "NODE_RANK", "RUN_DIR")}
    env.update(HF_CKPT=str(ckpt), VENV=str(Path(sys.executable).parents[1]), SKIP_SETUP="1",
               RUN_DIR=str(tmp / "launch"), OMP_NUM_THREADS="1")
    train, evals = write_math_data(tmp / "data")
    args = ["bash", str(REPO / "scripts" / "run-qwen3-30B-A3B.sh"), "--cpu",
            f"run.output_dir={tmp / 'runs'}", f"run.cache_dir={tmp / 'cache'}", "data.source=jsonl",
            f"data.train_path={train}", f"data.eval_path={evals}", "data.template=qwen_chat", "run.stages=[rl,eval]",
            "train.lr=1e-3", "rollout.prompts_per_step=4", "rollout.n_samples_per_prompt=4",
            "rollout.max_response_len=16", "train.micro_batch_size=16", "eval.n_prompts=4", "eval.n_samples=2",
            "eval.k=[1,2]", *ENGINE, *overrides]
    proc = subprocess.Popen(args, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the launcher ran past {timeout}s; stderr tail:\n{err[-3000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_tiny_hf_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-moe-hf"))


# ~90 s on a 2-core CI machine (Ray, 2 trainer ranks, 2 engine servers and a router start): a slow check. The
# default run keeps its parts: the launcher's plan from the checkpoint (tests/orchestration/test_plan.py, dry runs),
# TP/EP trainers equal to one process (tests/megatron_glue/test_parallel.py), the checkpoint's names and weights
# (tests/megatron_glue/test_weight_names.py), the router (tests/engine/test_server_pool.py) and the loop with
# SGLang-protocol engines synced over a gloo group (tests/e2e/test_multinode.py).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_launcher_trains_tp2_ep2_on_cpu_from_the_hf_checkpoint(tmp_path, checkpoint):
    proc = run_launcher(tmp_path, checkpoint, f"train.steps={STEPS}", *LAYOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # the plan, printed and kept: the checkpoint's architecture, a CPU layout of 2 gloo ranks, no conversion
    plan = (tmp_path / "launch" / "plan.txt").read_text()
    assert plan.strip() and plan.strip() in proc.stdout
    assert "hidden 64" in plan and "4 experts top-2" in plan and "(hf_path)" in plan
    assert "CPU run, 2 trainer process(es)" in plan and "TP=2 PP=1 EP=2 ETP=1 DP=1" in plan
    assert "convert" not in proc.stderr and "starting the Ray head" not in proc.stderr
    model_yaml = (tmp_path / "launch" / "model.yaml").read_text()  # MODEL_CONFIG=checkpoint, the --cpu default
    assert "hidden_size: 64" in model_yaml and "num_layers: 2" in model_yaml

    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["complete"] is True and list(summary["stages"]) == ["data", "tokenizer", "rl", "eval"]
    assert summary["model_checkpoint"]["ignored_model_keys"] == {}  # the fragment was written from the checkpoint

    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(STEPS))
    # step t rolled out with version t (the loop refuses anything else) and both engines took every sync
    assert all(m["rollout/weight_version_min"] == m["rollout/weight_version_max"] == m["step"] for m in metrics)
    assert all(m["sync/engines_at_version"] == 2 and m["time/sync_push"] > 0 for m in metrics)
    assert "2 SGLang-protocol server(s)" in plan and "router on" in plan
    logs = run_dir / "engine_logs"
    assert sorted(p.name for p in logs.iterdir()) == ["engine_0.log", "engine_1.log", "router.log"]
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in metrics)
    assert metrics[0]["train/approx_kl_old"] < 1e-5  # the 2 ranks started from the checkpoint's weights

    start, end = read_hf_weights(checkpoint), read_hf_weights(run_dir / "hf")
    assert set(start) == set(end)
    assert any(not (start[k] == end[k]).all() for k in start), "the final weights equal the start checkpoint"
    assert (run_dir / "eval_final.json").is_file() and (run_dir / "final_table.md").is_file()
