"""Does the Megatron GRPO update point along the plain-PyTorch (HF) GRPO gradient?"""
import sys, torch; sys.path.insert(0, "/work/main")
torch.set_num_threads(2)
from megatron_glue.checkpoint_io import load_hf_checkpoint
from megatron_glue.sharding import shard_megatron_state
from megatron_glue.weight_names import hf_to_megatron
from megatron_glue.trainer import MegatronTrainer, TrainerSettings
from megatron_glue.model_provider import ParallelSizes
from megatron_glue.parallel import init_distributed, init_model_parallel
from megatron_glue.weight_export import export_hf_state_dict
from slime_ext.config import load_config
from slime_ext.engine.embedded import EmbeddedEngine
from slime_ext.orchestration.rollout_manager import RolloutManager
from slime_ext.tasks.prepare import prepare_data
from slime_ext.tokenizer import load_tokenizer
from transformers import AutoModelForCausalLM
hf_dir = sys.argv[1]
cfg = load_config("/work/main/configs/grpo.yaml", []).config
tok = load_tokenizer(hf_dir)
hf_config, src = load_hf_checkpoint(hf_dir)
init_distributed(); init_model_parallel(ParallelSizes(), seed=0)
tr = MegatronTrainer(hf_config, TrainerSettings(lr=1e-7, micro_batch_size=16, clip_grad=0.0), ParallelSizes(), pad_id=tok.pad_token_id)
tr.load_local_state_dict(shard_megatron_state(hf_to_megatron(src, hf_config), hf_config, 0, 1))
eng = EmbeddedEngine.from_pretrained(hf_dir)
data = prepare_data(cfg.data, "/work/main/.cache/slime_ext")
mgr = RolloutManager(cfg, data.train, tok, eng)
groups, m = mgr.rollout(0)
samples = [s for g in groups for s in g]
before = export_hf_state_dict(tr)
print("export==src max diff", max(float((before[k] - src[k]).abs().max()) for k in src))
print(tr.train_step(samples, "grpo"))
after = export_hf_state_dict(tr)
delta = {k: after[k] - before[k] for k in before}
# plain torch surrogate
model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
model.train(False)
total = sum(sum(s.loss_mask) for s in samples)
loss = 0.0
for s in samples:
    ids = torch.tensor([s.prompt_ids + s.response_ids])
    logits = model(ids).logits[0, :-1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    resp = lp[len(s.prompt_ids) - 1:]
    mask = torch.tensor(s.loss_mask, dtype=torch.float32)
    loss = loss - (s.advantage * resp * mask).sum() / total
loss.backward()
named = dict(model.named_parameters())
agree_w, tot_w, rows = 0.0, 0.0, []
for k, d in delta.items():
    if k not in named: rows.append((k, "not in HF module")); continue
    g = named[k].grad
    if g is None: rows.append((k, "no grad")); continue
    upd = d.flatten(); gg = -g.flatten()  # descent direction
    mask = upd.abs() > 0
    a = float(((torch.sign(upd) == torch.sign(gg)) * gg.abs())[mask].sum()); t = float(gg.abs()[mask].sum())
    agree_w += a; tot_w += t
    cos = float(torch.nn.functional.cosine_similarity(upd, torch.sign(gg), dim=0))
    rows.append((k, f"weighted sign agreement {a / max(t, 1e-30):.3f} cos(upd, sign g) {cos:.3f} |g| {float(g.norm()):.2e}"))
for r in rows: print(*r)
print("TOTAL weighted sign agreement", agree_w / tot_w)
