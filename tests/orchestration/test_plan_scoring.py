"""The plan of a method with scoring servers (on-policy distillation's teacher on engine servers of its own):
their GPUs taken from the trainer's, their bundles and Ray requests, their memory per GPU by hand, and the
layouts the plan refuses; the OPD launcher's dry run."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_ext.config import ConfigError, load_config
from slime_ext.orchestration.memory_model import GIB
from slime_ext.orchestration.plan import build_plan, main
from slime_ext.orchestration.plan_format import format_plan
from tests.conftest import CONFIGS
from tests.orchestration.test_plan import MISSING_CKPT, _launcher

TEACHER_SHAPE = CONFIGS / "models" / "qwen3-32b.yaml"
# Qwen3-32B by hand (HF config.json): untied embeddings, 64 layers of attention (q, k, v, o), a dense MLP and
# four norms (two hidden-wide, q/k head-wide), the final norm
H, LAYERS, HEADS, KV, HD, FFN, VOCAB = 5120, 64, 64, 8, 128, 25600, 151936
TEACHER_PARAMS = 2 * VOCAB * H + LAYERS * (H * HD * (2 * HEADS + 2 * KV) + 3 * H * FFN + 2 * H + 2 * HD) + H


def opd_config(tmp_path: Path, *overrides: str):
    """The OPD launcher's composition on two 8-GPU nodes: the student's reference layout on one, the teacher's
    two TP-4 servers on the other."""
    path = tmp_path / "opd.yaml"
    path.write_text(
        f"extends: {CONFIGS / 'opd.yaml'}\n"
        f"include: [{CONFIGS / 'models/qwen3-30b-a3b.yaml'}, {CONFIGS / 'cluster/h100x8-qwen3-30b-a3b.yaml'}]\n"
        "cluster: {num_nodes: 2}\n"
        f"model: {{hf_path: {MISSING_CKPT}}}\n"
        f"tokenizer: {{path: {MISSING_CKPT}}}\n"
        "train: {parallel: {data_parallel_size: 2}}\n"
        f"opd: {{teacher: /nonexistent/Qwen3-32B, teacher_engines: 2, teacher_tp_size: 4, "
        f"teacher_model_config: {TEACHER_SHAPE}}}\n"
    )
    return load_config(path, list(overrides)).config


def test_a_teacher_on_gpus_of_its_own_leaves_the_trainer_the_other_node(tmp_path):
    plan = build_plan(opd_config(tmp_path))
    assert plan.layout.world == 8 and plan.layout.dp == 2  # 16 GPUs - 8 of the teacher
    assert plan.placement.num_bundles == 16 and plan.rollout.models_per_engine == 1  # no teacher in the engines
    groups = {a.name: a for a in plan.actors}
    scoring = groups["scoring_engine"]
    assert scoring.count == 2 and scoring.bundles == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert scoring.resources == {"GPU": 1.0, "CPU": 1}
    assert groups["train_actor"].bundles == [[r] for r in range(8)]
    s = plan.scoring
    assert (s.gpus, s.params_total, s.shape_source) == (8, TEACHER_PARAMS, f"yaml: {TEACHER_SHAPE}")
    weights = TEACHER_PARAMS * 2 / 4 / GIB  # bf16, TP 4
    assert s.memory.weights_gib == pytest.approx(weights, abs=1e-3)
    assert s.memory.static_gib == pytest.approx(0.85 * 80)
    per_token = LAYERS * 2 * (KV // 4) * HD * 2  # K and V, 2 KV heads per rank, bf16
    assert s.memory.kv_tokens == int((0.85 * 80 - weights) * GIB // per_token)
    assert plan.memory_problems == []
    text = format_plan(plan)
    assert "scoring: 2 server(s) x TP 4 for opd.teacher" in text and "8 GPUs of their own" in text


def test_a_teacher_that_does_not_fit_is_refused_naming_its_keys(tmp_path, capsys):
    plan = build_plan(opd_config(tmp_path, "opd.teacher_mem_fraction_static=0.15"))  # 12 GiB < 15.3 of weights
    (problem,) = plan.memory_problems
    assert "teacher weights 15.26 GiB" in problem and "opd.teacher_mem_fraction_static" in problem
    # one TP-8 teacher on the student's node leaves the trainer nothing (one node)
    with pytest.raises(Exception, match="scoring servers take 8 GPUs of their own"):
        build_plan(opd_config(tmp_path, "cluster.num_nodes=1", "opd.teacher_engines=1", "opd.teacher_tp_size=8"))
    # on GPUs the plan must know the teacher's size: no checkpoint here and no model fragment is a problem
    plan = build_plan(opd_config(tmp_path, "opd.teacher_model_config=null"))
    assert any("opd.teacher_model_config" in p for p in plan.memory_problems)
    path = tmp_path / "opd.yaml"
    assert main([str(path), "opd.teacher_mem_fraction_static=0.15"]) == 3
    assert "teacher weights" in capsys.readouterr().err


def test_a_colocated_teacher_shares_the_engine_gpus_and_their_memory(tmp_path):
    plan = build_plan(opd_config(tmp_path, "cluster.num_nodes=1", "opd.teacher_placement=colocated",
                                 "opd.teacher_mem_fraction_static=0.2"))
    assert plan.layout.world == 8 and plan.placement.num_bundles == 8  # no GPU of its own
    scoring = {a.name: a for a in plan.actors}["scoring_engine"]
    assert scoring.bundles == [[0, 1, 2, 3], [4, 5, 6, 7]] and scoring.resources["GPU"] == 0.2
    # max(trainer, engine static 56) + teacher static 16 = 72 GiB <= 80: fits
    assert plan.memory_problems == [] and plan.scoring.memory.static_gib == pytest.approx(16.0)
    # both static pools on one GPU may not pass 0.9 of it
    with pytest.raises(ConfigError, match="0.7 \\+ 0.3 = 1.00 of each engine GPU"):
        opd_config(tmp_path, "cluster.num_nodes=1", "opd.teacher_placement=colocated",
                   "opd.teacher_mem_fraction_static=0.3")
    # without the engines' sleep the trainer, the engine and the teacher stay resident together
    plan = build_plan(opd_config(tmp_path, "cluster.num_nodes=1", "opd.teacher_placement=colocated",
                                 "opd.teacher_mem_fraction_static=0.2", "cluster.colocate_sleep=false"))
    assert any("trainer, a rollout engine and the teacher" in p and "opd.teacher_placement=own" in p
               for p in plan.memory_problems)


def test_opd_launcher_dry_run_plans_the_teacher_on_its_own_node(tmp_path):
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B-opd.sh", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("method=opd", "world=8 TP=4 PP=1 EP=8", "DP=2", "1 SGLang engine(s) x TP 8",
                   "scoring: 2 server(s) x TP 4 for opd.teacher", "32.76B params", "8 GPUs of their own",
                   "memory per teacher GPU: weights 15.26 GiB", "scoring_engine x2"):
        assert needle in out, needle
    assert "TEACHER_CKPT is not set" in proc.stderr
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B-opd.sh", timeout=60)
    assert proc.returncode == 2 and "set TEACHER_CKPT" in proc.stderr
