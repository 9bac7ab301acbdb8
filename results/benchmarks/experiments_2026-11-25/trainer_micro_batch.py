"""Megatron train step tokens/s by micro-batch size on the cpu-tiny preset (README.md beside this file)."""
import sys, torch
sys.path.insert(0, '.')
torch.set_num_threads(1)
from benchmarks import train_step as ts
from transformers import AutoModelForCausalLM
for mbs in (16, 32, 64, 8):
    preset = dict(ts.PRESETS["cpu-tiny"], micro_batch=mbs, steps=4)
    torch.manual_seed(0)
    cfg = ts.hf_config_for(preset)
    state = {k: v.clone() for k, v in AutoModelForCausalLM.from_config(cfg).state_dict().items()}
    r = ts.time_megatron(preset, cfg, state, ts.make_samples(preset), "cpu")
    print(mbs, round(r["tokens_per_s"]), round(r["seconds_per_step"], 3), flush=True)
