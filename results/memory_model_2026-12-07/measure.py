"""The memory plan's estimates against measured peaks, every case of tests/orchestration/test_memory_model.py (the
default and the slow ones), printed as ratios, because the test only asserts 15% and docs/memory.md quotes the ratios.
Run from the repository root (about 75 s on 2 cores):
    OMP_NUM_THREADS=1 PYTHONPATH=. python results/memory_model_2026-12-07/measure.py > results/memory_model_2026-12-07/ratios.md
"""
import platform
from datetime import datetime, timezone

from tests.orchestration import test_memory_model as case

print(f"# Memory plan vs measured peak ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, CPU)\n")
print("Estimate / measured (1.00 = exact); the test fails outside 0.85-1.15 of the measured value.\n")
print("| trainer case | tokens per micro-batch | static | step growth | total |\n| --- | ---: | ---: | ---: | ---: |")
for length in case.LENGTHS:
    for size in case.SIZES:
        _, static_est, dynamic_est, static, growth = case.trainer_case(size, length)
        print(f"| {size} | {case.MICRO_BATCH * length} | {static_est / static:.3f} | {dynamic_est / growth:.3f} | "
              f"{(static_est + dynamic_est) / (static + growth):.3f} |", flush=True)
print("\n| engine case | prompt + new tokens | rows | weights | generate growth | total |\n| --- | --- | ---: | ---: | ---: | ---: |")
for prompt, new in case.ENGINE_LENGTHS:
    for size in case.ENGINE_SIZES:
        est, rest, weights, growth = case.engine_case(size, prompt, new)
        print(f"| {size} | {prompt} + {new} | {est.rows} | {est.components_mib['weights'] * 2**20 / weights:.3f} | "
              f"{rest / growth:.3f} | {est.total_mib * 2**20 / (weights + growth):.3f} |", flush=True)
