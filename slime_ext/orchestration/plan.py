"""The resolved cluster plan of a run config, computed without starting anything.

`python -m slime_ext.orchestration.plan CONFIG [key=value ...] [--json]` prints what a launch would build: nodes and
GPUs, the trainer layout (TP / PP / EP / DP), the rollout engines and the exact command of engine 0,
the Ray actors with their placement-group bundles, and a per-GPU memory estimate compared with the GPU
(H100: 80 GiB). Why: a 30B MoE launch costs many node-minutes before it fails on a layout or memory
mistake; the same numbers checked here fail in a second on a laptop (the launcher's `--dry-run`).

The parts: the model's shape (`plan_shape`), the layouts and their rules (`plan_layout`, megatron-core's
divisibility rules listed there), engine 0's command (`plan_engine`), memory (`memory_model`: every term,
measured counts, what it leaves out), placement and actors (`placement`), the result (`plan_types.Plan`) and the text (`plan_format`). A
layout whose trainer or engine estimate exceeds `cluster.gpu_memory_gib` (or, with optimizer offload, whose
host share exceeds `cluster.host_memory_gib`) is refused: the CLI prints the plan, then the error naming the
terms and the keys that shrink them, and exits 3 (`--allow-over` prints it without failing).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from slime_ext.config.loader import ConfigError, load_config
from slime_ext.config.schema import Config
from slime_ext.methods.registry import method_name
from slime_ext.orchestration.memory_model import (colocated_problems, embedded_engine_memory, engine_memory,
                                                  lora_expert_params_per_rank, lora_params_per_rank,
                                                  over_memory_problems, trainer_memory)
from slime_ext.orchestration.placement import actor_groups, build_placement
from slime_ext.orchestration.plan_format import format_plan
from slime_ext.orchestration.plan_layout import PlanError, build_layout, build_rollout, layout_warnings
from slime_ext.orchestration.plan_scoring import build_scoring, colocated_scoring_problems
from slime_ext.orchestration.plan_shape import load_model_shape
from slime_ext.orchestration.plan_types import Plan

GPU_MEMORY_GIB = 80.0  # H100 80GB (cluster.gpu_memory_gib's default)


def build_plan(config: Config, gpu_memory_gib: Optional[float] = None) -> Plan:
    """Everything a launch of `config` would build, computed without starting anything. `gpu_memory_gib`
    overrides `cluster.gpu_memory_gib`."""
    gpu_memory_gib = gpu_memory_gib or config.cluster.gpu_memory_gib
    shape, warnings = load_model_shape(config)
    layout = build_layout(config, shape)
    warnings += layout_warnings(layout, config)
    rollout = build_rollout(config, warnings)
    seq = config.rollout.max_prompt_len + config.rollout.max_response_len
    # the trainer's micro-batches: at most micro_batch_size rows and max_tokens_per_gpu padded tokens, but a
    # longer single sequence still trains (alone)
    tokens = max(seq, min(layout.max_tokens_per_gpu, config.train.micro_batch_size * seq))
    if seq > layout.max_tokens_per_gpu:
        warnings.append(f"one sequence (rollout.max_prompt_len + max_response_len = {seq}) exceeds "
                        f"train.parallel.max_tokens_per_gpu = {layout.max_tokens_per_gpu}: such samples train alone")
    lora = config.train.lora
    targets = tuple(lora.target_modules)
    tmem = trainer_memory(shape, layout, gpu_memory_gib, config.train.logprob_chunk_mb, tokens,
                          lora_params_per_rank(shape, layout, lora.rank, targets),
                          lora_expert_params_per_rank(shape, layout, lora.rank, targets))
    emem = engine_memory(shape, config, rollout, gpu_memory_gib)
    problems = over_memory_problems(tmem, emem, gpu_memory_gib, config.cluster.host_memory_gib, seq)
    problems += colocated_problems(tmem, emem, gpu_memory_gib, colocate=config.cluster.colocate,
                                   sleep=config.cluster.colocate_sleep, gpus_per_node=config.cluster.gpus_per_node,
                                   sync_buffer_gib=2 * config.sglang.weight_bucket_mb / 1024)
    scoring = build_scoring(config, rollout, gpu_memory_gib, warnings, problems)
    problems += colocated_scoring_problems(scoring, tmem, emem, config, gpu_memory_gib)
    embedded = (embedded_engine_memory(shape, config, rollout.models_per_engine)
                if config.cluster.gpus_per_node == 0 else None)
    return Plan(method=method_name(config), run_name=config.run.name, model=shape, layout=layout, rollout=rollout,
                placement=build_placement(config), actors=list(actor_groups(config).values()),
                trainer_memory=tmem, engine_memory=emem, gpu_memory_gib=gpu_memory_gib, warnings=warnings,
                memory_problems=problems, embedded_engine_memory=embedded, scoring=scoring)


def main(argv: Optional[list[str]] = None) -> int:
    """The command line: exit 0, 2 (a config or layout error) or 3 (the layout does not fit)."""
    parser = argparse.ArgumentParser(prog="python -m slime_ext.orchestration.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="YAML run config")
    parser.add_argument("overrides", nargs="*", help="a.b.c=value overrides")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--gpu-mem-gib", type=float, default=None,
                        help="memory of one GPU (default: cluster.gpu_memory_gib)")
    parser.add_argument("--allow-over", action="store_true",
                        help="print a plan that does not fit without failing (exit 0)")
    args = parser.parse_intermixed_args(argv)
    try:
        plan = build_plan(load_config(args.config, args.overrides).config, args.gpu_mem_gib)
    except (ConfigError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else format_plan(plan))
    if plan.memory_problems and not args.allow_over:
        print("error: the layout does not fit:\n  " + "\n  ".join(plan.memory_problems), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
