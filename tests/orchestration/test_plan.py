"""The cluster plan (`slime_ext.orchestration.plan`) and the Qwen3-30B-A3B launcher's dry run.

Why: a multi-node launch fails late and expensively on a layout or memory mistake; these checks run the
same arithmetic on a CPU machine, and hand-check the numbers against the stated split rules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_glue.hf_config import hf_config_from_model_config, parameter_counts
from slime_ext.config import load_config
from slime_ext.orchestration.memory_model import GIB
from slime_ext.orchestration.plan_shape import param_split
from slime_ext.orchestration.plan import build_plan, main
from slime_ext.orchestration.plan_format import format_plan
from slime_ext.orchestration.plan_layout import PlanError
from tests.conftest import CONFIGS, REPO

MISSING_CKPT = "/nonexistent/Qwen3-30B-A3B"

# Qwen3-30B-A3B by hand (HF config.json): the numbers the split rules are checked against.
H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB, EXPERTS, MOE_FFN = 2048, 48, 32, 4, 128, 151936, 128, 768
ATTN = H * HEAD_DIM * (2 * HEADS + 2 * KV_HEADS)  # q, k, v, o
EXPERT_MLP = EXPERTS * 3 * H * MOE_FFN  # gate, up, down of every expert
REPLICATED = 2 * H + 2 * HEAD_DIM + EXPERTS * H  # 2 norms, q/k norms, router
EMBED = VOCAB * H  # untied: the output layer has as many


def reference_config(tmp_path: Path, *overrides: str, ckpt: str = MISSING_CKPT):
    """The config the launcher composes (grpo + model + cluster fragments, checkpoint paths)."""
    path = tmp_path / "qwen3.yaml"
    path.write_text(
        f"extends: {CONFIGS / 'grpo.yaml'}\n"
        f"include: [{CONFIGS / 'models/qwen3-30b-a3b.yaml'}, {CONFIGS / 'cluster/h100x8-qwen3-30b-a3b.yaml'}]\n"
        f"model: {{hf_path: {ckpt}}}\n"
        f"tokenizer: {{path: {ckpt}}}\n"
        f"sglang: {{model_path: {ckpt}}}\n"
        "train: {parallel: {data_parallel_size: 2}}\n"
    )
    return load_config(path, overrides).config


@pytest.fixture(scope="module")
def reference_plan(tmp_path_factory):
    return build_plan(reference_config(tmp_path_factory.mktemp("plan")))


def test_reference_layout(reference_plan):
    L = reference_plan.layout
    assert (L.num_nodes, L.gpus_per_node, L.world) == (1, 8, 8)
    assert (L.tp, L.pp, L.ep, L.etp, L.dp, L.expert_dp) == (4, 1, 8, 1, 2, 1)
    assert L.sequence_parallel and L.recompute == "full" and L.optimizer_cpu_offload and L.backend == "nccl"
    r = reference_plan.rollout
    assert (r.engine, r.num_engines, r.tp_size, r.engine_gpus, r.colocate) == ("sglang", 1, 8, 8, True)
    cmd = r.server_command
    assert cmd[cmd.index("--tp-size") + 1] == "8" and cmd[cmd.index("--model-path") + 1] == MISSING_CKPT
    assert "--enable-memory-saver" in cmd  # colocated engines release memory while the trainer runs
    assert reference_plan.model.source == "yaml"
    assert any("does not exist" in w for w in reference_plan.warnings)


def test_param_split_matches_parameter_counts(reference_plan):
    split = reference_plan.model.split
    assert (split.attention, split.experts, split.replicated, split.embedding) == (ATTN, EXPERT_MLP, REPLICATED, EMBED)
    total = LAYERS * (ATTN + EXPERT_MLP + REPLICATED) + 2 * EMBED + H
    assert split.total == total == reference_plan.model.params_total
    assert 30.0e9 < total < 31.0e9  # "30B"


def test_trainer_memory_by_hand(reference_plan):
    """Split rule: attention and embeddings / TP, experts / (EP x ETP), norms + router replicated."""
    mem = reference_plan.trainer_memory
    local = LAYERS * ATTN // 4 + 2 * EMBED // 4 + LAYERS * REPLICATED + H + LAYERS * EXPERT_MLP // 8
    assert mem.local_params == local and mem.local_expert_params == LAYERS * EXPERT_MLP // 8
    assert mem.components_gib["weights"] == pytest.approx(2 * local / GIB, abs=1e-3)  # bf16
    assert mem.components_gib["grads_fp32"] == pytest.approx(4 * local / GIB, abs=1e-3)
    assert mem.components_gib["optimizer"] == 0.0  # offloaded to the host
    # full recompute keeps each layer's bf16 input, sequence-parallel: 20480 / TP tokens per GPU
    assert mem.components_gib["act_layer_checkpoints"] == pytest.approx(LAYERS * 20480 / 4 * H * 2 / GIB, abs=1e-3)
    assert 20 < mem.total_gib < 80 and mem.fits is True
    assert mem.total_gib == pytest.approx(sum(mem.components_gib.values()), abs=0.01)
    # host memory of the offloaded optimizer: fp32 main params + Adam moments of the whole model, one node
    assert mem.host_offload_gib_per_node == pytest.approx(12 * reference_plan.model.params_total / GIB, rel=0.01)


def test_engine_memory_by_hand(reference_plan):
    eng = reference_plan.engine_memory
    assert eng.weights_gib == pytest.approx(2 * reference_plan.model.params_total / 8 / GIB, abs=1e-3)
    assert eng.static_gib == pytest.approx(0.7 * 80)
    assert eng.kv_cache_gib == pytest.approx(eng.static_gib - eng.weights_gib, abs=1e-3)
    assert eng.kv_bytes_per_token == LAYERS * 2 * 1 * HEAD_DIM * 2  # 4 KV heads over TP 8: one per GPU
    assert eng.fits and eng.kv_tokens > 1_000_000


def test_plan_text_names_layout_and_memory(reference_plan):
    text = format_plan(reference_plan)
    for needle in ("TP=4", "EP=8", "8 GPUs", "--tp-size 8", "memory trainer per GPU", "memory engine per GPU",
                   "train_actor x8", "bundles 0-7", "'GPU': 1, 'CPU': 1"):
        assert needle in text, needle
    assert "OVER" not in text


def test_optimizer_on_gpu_without_offload(tmp_path, reference_plan):
    plan = build_plan(reference_config(tmp_path, "train.parallel.optimizer_cpu_offload=false"))
    mem = plan.trainer_memory
    split_local = mem.local_params - mem.local_expert_params
    # fp32 main params + Adam moments: non-expert params sharded over DP=2, experts over expert-DP=1
    expected = 12 * (split_local / 2 + mem.local_expert_params) / GIB
    assert mem.components_gib["optimizer"] == pytest.approx(expected, abs=1e-3)
    assert mem.total_gib == pytest.approx(reference_plan.trainer_memory.total_gib + expected, abs=0.01)


def test_over_is_flagged(tmp_path):
    plan = build_plan(reference_config(tmp_path, "train.parallel.optimizer_cpu_offload=false",
                                       "train.parallel.recompute=none"))
    assert plan.trainer_memory.fits is False and "OVER" in format_plan(plan)
    assert len(plan.memory_problems) == 1 and "trainer needs" in plan.memory_problems[0]


def test_dry_run_refuses_a_layout_that_does_not_fit(tmp_path):
    """TP 1 / EP 1 puts the whole 30B model's bf16 weights and fp32 gradients on each GPU: the launcher's dry run
    fails, naming the overflowing terms and the keys that shrink them (it printed OVER and exited 0 before)."""
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B.sh", "--dry-run", "train.parallel.tensor_model_parallel_size=1",
                     "train.parallel.expert_model_parallel_size=1")
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "dry run OK" not in proc.stdout + proc.stderr
    err = proc.stderr
    # 30.5B params, experts and the rest unsplit: 4 bytes of fp32 gradient each is ~114 GiB on its own
    assert "grads_fp32 113.7" in err and "weights 56.8" in err and "cluster.gpu_memory_gib" in err
    assert "train.parallel.tensor_model_parallel_size / expert_model_parallel_size" in err


def test_check_refuses_over_memory_and_names_the_term(tmp_path, capsys):
    from slime_ext.config.__main__ import main as config_main

    reference_config(tmp_path)
    config = str(tmp_path / "qwen3.yaml")
    assert config_main(["--check", config]) == 0
    capsys.readouterr()
    # the reference trainer needs ~29 GiB per GPU: a 24 GiB card overflows it
    assert config_main(["--check", config, "cluster.gpu_memory_gib=24"]) == 3
    err = capsys.readouterr().err
    assert "trainer needs" in err and "more than the 24 GiB of cluster.gpu_memory_gib" in err
    assert "grads_fp32" in err
    # the engine: weights above the static pool name the SGLang keys
    assert config_main(["--check", config, "sglang.mem_fraction_static=0.05", "cluster.gpu_memory_gib=80"]) == 3
    assert "sglang.mem_fraction_static" in capsys.readouterr().err
    # host RAM with the offloaded optimizer: 12 bytes x 30.5B params on one node = 341 GiB
    assert config_main(["--check", config, "cluster.host_memory_gib=256"]) == 3
    assert "cluster.host_memory_gib = 256" in capsys.readouterr().err
    assert config_main(["--check", config, "cluster.host_memory_gib=512"]) == 0


def test_plan_cli_allow_over(tmp_path, capsys):
    reference_config(tmp_path)
    config = str(tmp_path / "qwen3.yaml")
    assert main([config, "cluster.gpu_memory_gib=24"]) == 3
    assert "does not fit" in capsys.readouterr().out
    assert main([config, "cluster.gpu_memory_gib=24", "--allow-over"]) == 0


def test_tandem_engine_holds_two_models(tmp_path, reference_plan):
    plan = build_plan(reference_config(tmp_path, "method=tandem"))
    assert plan.rollout.models_per_engine == 2
    assert plan.engine_memory.weights_gib == pytest.approx(2 * reference_plan.engine_memory.weights_gib, abs=1e-3)


@pytest.mark.parametrize("override, key", [
    ("train.parallel.tensor_model_parallel_size=3", "train.parallel.tensor_model_parallel_size"),
    ("train.parallel.expert_model_parallel_size=16", "train.parallel.expert_model_parallel_size"),
    ("train.parallel.data_parallel_size=4", "train.parallel.data_parallel_size"),
    ("sglang.num_engines=2", "sglang.num_engines"),
    ("train.parallel.expert_tensor_parallel_size=4", "train.parallel.expert_tensor_parallel_size"),  # 4x8 > 8
    ("train.parallel.expert_tensor_parallel_size=2", "train.parallel.expert_tensor_parallel_size"),  # not 1 or TP
])
def test_bad_layout_names_the_key(tmp_path, override, key):
    with pytest.raises(PlanError) as err:
        build_plan(reference_config(tmp_path, override))
    assert key in str(err.value)


def test_cli_json_and_error_exit(tmp_path, capsys):
    reference_config(tmp_path)  # writes qwen3.yaml
    config = tmp_path / "qwen3.yaml"
    assert main([str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layout"]["tp"] == 4 and data["trainer_memory"]["fits"] is True
    assert main([str(config), "train.parallel.tensor_model_parallel_size=3"]) == 2
    assert "train.parallel.tensor_model_parallel_size" in capsys.readouterr().err


def test_existing_checkpoint_config_wins(tmp_path):
    """With a real checkpoint dir its config.json is the architecture (here: the tiny model's)."""
    tiny = load_config(CONFIGS / "grpo.yaml").config
    hf = hf_config_from_model_config(tiny.model, tokenizer_vocab=tiny.tokenizer.vocab_size)
    ckpt = tmp_path / "ckpt"
    hf.save_pretrained(ckpt)
    # the tiny checkpoint's context (1024 tokens) must hold prompt + response: validation checks it
    plan = build_plan(reference_config(tmp_path, "train.parallel.tensor_model_parallel_size=2",
                                       "train.parallel.data_parallel_size=4", "sglang.tp_size=4",
                                       "rollout.max_prompt_len=256", "rollout.max_response_len=512", ckpt=str(ckpt)))
    assert plan.model.source == "hf_path" and plan.model.hidden == 128
    assert plan.model.params_total == parameter_counts(hf)["total"]
    assert not any("does not exist" in w for w in plan.warnings)


def test_default_cpu_config_plan():
    plan = build_plan(load_config(CONFIGS / "grpo.yaml").config)
    L = plan.layout
    assert (L.num_nodes, L.total_gpus, L.world, L.backend) == (1, 0, 2, "gloo")  # local-cpu.yaml: DP 2
    assert plan.rollout.engine == "embedded" and plan.rollout.server_command is None
    assert plan.engine_memory is None and plan.trainer_memory.fits is None
    text = format_plan(plan)
    assert "0 GPUs" in text and "gloo" in text and "embedded engine" in text


def test_param_split_dense_model():
    cfg = load_config(CONFIGS / "grpo.yaml", ["model.arch=qwen3", "model.num_experts=0"]).config
    hf = hf_config_from_model_config(cfg.model, tokenizer_vocab=cfg.tokenizer.vocab_size)
    assert param_split(hf).total == parameter_counts(hf)["total"]


def _launcher(tmp_path: Path, script: str, *args: str, timeout: int = 300, **env_vars: str):
    """Run a cluster launcher in tmp_path with the test venv, no setup, a checkpoint path that does not
    exist and none of the caller's launcher variables; `env_vars` are added."""
    env = {**os.environ, "HF_CKPT": MISSING_CKPT, "VENV": str(Path(sys.executable).parents[1]), "SKIP_SETUP": "1",
           "TMPDIR": str(tmp_path)}
    for leaked in ("DRY_RUN", "CPU_RUN", "METHOD_CONFIG", "MODEL_CONFIG", "CLOUD_URL", "JUNIOR_CKPT", "NNODES", "RUN_DIR",
                   "GPUS_PER_NODE", "SCORING_GPUS", "TEACHER_CKPT", "TEACHER_ENGINES", "TEACHER_TP", "TEACHER_MODEL_CONFIG"):
        env.pop(leaked, None)
    env.update(env_vars)
    return subprocess.run(["bash", str(REPO / "scripts" / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_dry_run_script(tmp_path):
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B.sh", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("TP=4", "EP=8", "8 GPUs", "--tp-size 8", "memory trainer per GPU", "does not exist"):
        assert needle in out, needle
    assert "DP=2" in out and "data_parallel_size" not in out  # the launcher writes DP out: no warning
    assert list(tmp_path.iterdir()) == []  # the composed config was a temp file, removed
    assert "convert" not in proc.stderr and "MCORE" not in proc.stderr  # the trainer loads the HF checkpoint


def test_cpu_dry_run_takes_the_model_from_the_checkpoint(tmp_path):
    """--cpu: the local CPU cluster fragment, the model fragment from HF_CKPT/config.json (MODEL_CONFIG=checkpoint)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    hf_config = hf_config_from_model_config(load_config(CONFIGS / "grpo.yaml", ["model.vocab_size=512"]).config.model)
    hf_config.save_pretrained(ckpt)  # config.json of the embedded default's shape: 4 layers, hidden 128
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B.sh", "--cpu", "--dry-run", HF_CKPT=str(ckpt))
    assert proc.returncode == 0, proc.stderr
    for needle in ("model: ckpt (hf_path)", "4 layers, hidden 128", "0 GPUs (CPU run, 2 trainer process(es))",
                   "backend gloo", "rollout: embedded engine"):
        assert needle in proc.stdout, needle
    assert "(it starts a local Ray)" in proc.stderr


def test_cpu_mode_needs_the_checkpoint_or_a_model_fragment_and_one_node(tmp_path):
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B.sh", "--cpu", "--dry-run", timeout=60)
    assert proc.returncode == 1 and "MODEL_CONFIG=checkpoint needs HF_CKPT/config.json" in proc.stderr
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B.sh", "--cpu", "--dry-run", NNODES="2", timeout=60)
    assert proc.returncode == 1 and "NNODES must be 1" in proc.stderr


def test_dry_run_script_rejects_bad_layout(tmp_path):
    env = {**os.environ, "VENV": str(Path(sys.executable).parents[1]), "SKIP_SETUP": "1", "NNODES": "2",
           "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(REPO / "scripts/run-qwen3-30B-A3B.sh"), "--dry-run",
                           "train.parallel.tensor_model_parallel_size=3"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and "train.parallel.tensor_model_parallel_size" in proc.stderr


def test_tandem_launcher_dry_run_plans_the_pair(tmp_path):
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B-tandem.sh", "--dry-run", JUNIOR_CKPT="/ckpt/junior")
    assert proc.returncode == 0, proc.stderr
    assert "method=tandem" in proc.stdout and "2 model(s) per engine" in proc.stdout


@pytest.mark.slow  # the same launcher mechanism as test_dry_run_script and the tandem launcher's
def test_duet_launcher_dry_run(tmp_path):
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B-duet.sh", "--dry-run", "duet.budget_fraction=0.25")
    assert proc.returncode == 0, proc.stderr
    assert "method=duet" in proc.stdout


@pytest.mark.slow  # the same launcher mechanism as test_dry_run_script and the tandem launcher's
def test_sxs_launcher_dry_run_runs_both_stages(tmp_path):
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B-sxs.sh", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "method=sxs_sft" in proc.stdout and "method=sxs_rl" in proc.stdout


@pytest.mark.slow  # the same launcher mechanism as test_dry_run_script and the tandem launcher's
def test_dagrpo_launcher_dry_run(tmp_path):
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B-dagrpo.sh", "--dry-run", CLOUD_URL="http://cloud:30000")
    assert proc.returncode == 0, proc.stderr
    assert "method=dagrpo" in proc.stdout


def test_dagrpo_launcher_refuses_to_start_without_a_cloud_endpoint(tmp_path):
    proc = _launcher(tmp_path, "run-qwen3-30B-A3B-dagrpo.sh", "--dry-run", timeout=60)
    assert proc.returncode == 2 and "set CLOUD_URL" in proc.stderr


def test_plan_prints_the_schedule(tmp_path):
    on = format_plan(build_plan(reference_config(tmp_path)))
    assert "schedule: on-policy: rollout t (weights version t), then train t" in on
    off = build_plan(reference_config(tmp_path, "cluster.colocate=false", "rollout.max_staleness=1",
                                      "rollout.partial_rollouts=true", "cluster.num_nodes=2"))  # 8 engine + 8 trainer GPUs
    assert (off.rollout.max_staleness, off.rollout.partial_rollouts, off.rollout.stale_tokens) == (1, True, "mask")
    text = format_plan(off)
    assert "schedule: asynchronous (max_staleness 1): rollouts run while the trainer trains" in text
    assert "at most 1 version(s) behind the step that trains it" in text
    assert "partial rollouts; older tokens: mask" in text
    assert "warning: rollout.max_staleness=1 trains stale tokens without the decoupled loss's correction" in text
    corrected = build_plan(reference_config(tmp_path, "cluster.colocate=false", "rollout.max_staleness=1",
                                            "grpo.mismatch.mode=mask", "cluster.num_nodes=2"))
    assert "without the decoupled loss's correction" not in format_plan(corrected)


def test_a_colocated_gpu_is_counted_with_both_sleeps_and_refused_without(tmp_path):
    """30B reference layout: trainer 30.09 GiB, engine static pool 0.7 x 80 = 56 GiB per GPU. With both sleeps the GPU
    needs max(30.09, 56) + two 512 MiB buckets = 57 GiB (fits 80); without, both would stay resident (86 GiB)."""
    asleep = build_plan(reference_config(tmp_path))
    assert asleep.memory_problems == []
    awake = build_plan(reference_config(tmp_path, "cluster.colocate_sleep=false"))
    (problem,) = awake.memory_problems
    assert "cluster.colocate_sleep is false" in problem and "trainer 30.09 GiB + engine static pool 56.00 GiB" in problem
    # a 44 GiB GPU with a 0.99 static pool: each side fits alone (30.09, 43.56 GiB) but not with the sync buffers
    tight = build_plan(reference_config(tmp_path, "cluster.gpu_memory_gib=44", "sglang.mem_fraction_static=0.99"))
    assert any("a colocated GPU needs max(trainer" in p for p in tight.memory_problems), tight.memory_problems
