"""torch.compile(dynamic=True) of the static-KV forward against eager, one decode of 64 rows x 64 tokens (CPU).

grouped_mm stays eager (torch.compile's meta kernel for it accepts bf16 only). Run from the repository root:
    OMP_NUM_THREADS=1 python results/benchmarks/experiments_2026-11-25/compile_decode_step.py
"""
import sys
import time

import torch
import torch._dynamo

sys.path.insert(0, ".")
torch.set_num_threads(1)
from benchmarks import decode as dc  # noqa: E402
from slime_ext.engine import static_kv  # noqa: E402

model = dc.build_model(320)
prompts = dc.prompts(64, 320)
print("eager", min(dc.run_embedded(model, prompts, 64) for _ in range(2)), flush=True)
static_kv._grouped_linear = torch._dynamo.disable(static_kv._grouped_linear)
torch._dynamo.config.cache_size_limit = 64
compiled = torch.compile(static_kv.QwenStaticForward.__call__, dynamic=True)
static_kv.QwenStaticForward.__call__ = lambda self, *a, **k: compiled(self, *a, **k)
start = time.perf_counter()
print("first (with compile)", dc.run_embedded(model, prompts, 64), flush=True)
for _ in range(3):
    print("compiled run", dc.run_embedded(model, prompts, 64), flush=True)
