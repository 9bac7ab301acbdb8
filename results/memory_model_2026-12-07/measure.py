"""The memory plan's estimates against measured peaks, every case of tests/orchestration/test_memory_model.py (the
default and the slow ones), printed as ratios, because the test only asserts 15% and docs/memory.md quotes the ratios.
Run from the repository root (about 3 minutes on 2 cores):
    OMP_NUM_THREADS=1 PYTHONPATH=. python results/memory_model_2026-12-07/measure.py > results/memory_model_2026-12-07/ratios.md
"""
import platform
from datetime import datetime, timezone

from slime_ext.orchestration.memory_model import GIB, trainer_memory
from slime_ext.orchestration.plan import build_plan
from tests.orchestration import test_memory_model as case

print(f"# Memory plan vs measured peak ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, CPU)\n")
print("Estimate / measured (1.00 = exact); the test fails outside 0.85-1.15 of the measured value.\n")
print("| trainer case | tokens per micro-batch | static | step growth | total |\n| --- | ---: | ---: | ---: | ---: |")
for length in case.LENGTHS:
    for size in case.SIZES:
        config = case._config(size, length)
        plan = build_plan(config)
        tokens = case.MICRO_BATCH * length
        est = trainer_memory(plan.model, plan.layout, config.cluster.gpu_memory_gib, config.train.logprob_chunk_mb, tokens)
        comps = {k: v * GIB for k, v in est.components_gib.items()}
        static_est = comps["weights"] + comps["grads_fp32"] + comps["optimizer"]
        dynamic_est = sum(v for k, v in comps.items() if k not in ("weights", "grads_fp32", "optimizer"))
        static, growth = case._measure(config, length)
        print(f"| {size} | {tokens} | {static_est / static:.3f} | {dynamic_est / growth:.3f} | "
              f"{(static_est + dynamic_est) / (static + growth):.3f} |", flush=True)
print("\n| engine case | prompt + new tokens | rows | weights | generate growth | total |\n| --- | --- | ---: | ---: | ---: | ---: |")
for prompt, new in case.ENGINE_LENGTHS:
    for size in case.ENGINE_SIZES:
        config = case._engine_config(size, prompt, new)
        est = build_plan(config).embedded_engine_memory
        weights, growth = case._measure_engine(config)
        comps = {k: v * 2**20 for k, v in est.components_mib.items()}
        rest = sum(v for k, v in comps.items() if k != "weights")
        print(f"| {size} | {prompt} + {new} | {est.rows} | {comps['weights'] / weights:.3f} | {rest / growth:.3f} | "
              f"{est.total_mib * 2**20 / (weights + growth):.3f} |", flush=True)
