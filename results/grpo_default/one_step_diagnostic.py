import sys, torch, glob; sys.path.insert(0, "/work/main")
torch.set_num_threads(2)
from megatron_glue.checkpoint_io import load_hf_checkpoint
from megatron_glue.sharding import shard_megatron_state
from megatron_glue.weight_names import hf_to_megatron
from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from megatron_glue.model_provider import ParallelSizes
from megatron_glue.parallel import init_distributed, init_model_parallel
from slime_ext.config import load_config
from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.orchestration.rollout_manager import RolloutManager
from slime_ext.tasks.prepare import prepare_data
from slime_ext.tokenizer import load_tokenizer
hf_dir = sys.argv[1]
cfg = load_config("configs/grpo.yaml", ["model.router_aux_loss_coef=0"]).config
tok = load_tokenizer(hf_dir)
hf_config, src = load_hf_checkpoint(hf_dir)
init_distributed(); init_model_parallel(ParallelSizes(), seed=0)
tr = MegatronTrainer(hf_config, TrainerSettings(lr=float(sys.argv[2]), adam_eps=float(sys.argv[3]), micro_batch_size=16), ParallelSizes(), pad_id=tok.pad_token_id)
tr.load_local_state_dict(shard_megatron_state(hf_to_megatron(src, hf_config), hf_config, 0, 1))
eng = EmbeddedEngine.from_pretrained(hf_dir)
data = prepare_data(cfg.data, cfg.run.cache_dir)
mgr = RolloutManager(cfg, data.train, tok, eng)
groups, m = mgr.rollout(0)
samples = [s for g in groups for s in g]
print("reward", m["reward/mean"])
before = tr.compute_logprobs(samples)["logprobs"]
import statistics
d_eng = max(float((before[s.sample_id] - torch.tensor(s.logprobs)).abs().max()) for s in samples)
print("max |trainer - engine| logprob", d_eng)
print(tr.train_step(samples, "grpo"))
after = tr.compute_logprobs(samples)["logprobs"]
pos = [float(after[s.sample_id].sum() - before[s.sample_id].sum()) for s in samples if s.advantage > 0]
neg = [float(after[s.sample_id].sum() - before[s.sample_id].sum()) for s in samples if s.advantage < 0]
print("pos mean delta", statistics.mean(pos), "frac up", sum(p > 0 for p in pos) / len(pos))
print("neg mean delta", statistics.mean(neg), "frac down", sum(n < 0 for n in neg) / len(neg))
# per-sample: example with mistake
s = next(x for x in samples if x.advantage < 0)
print(repr(s.response_text[:200]), s.label, s.reward, s.advantage)
