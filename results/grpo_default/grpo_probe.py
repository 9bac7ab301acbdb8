"""GRPO dynamics probe, in one process: K steps from the warm start, held-out eval every E steps."""
import sys, time, json, argparse, statistics, torch; sys.path.insert(0, "/work/main")
ap = argparse.ArgumentParser()
ap.add_argument("hf_dir"); ap.add_argument("--lr", type=float, default=3e-5); ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--every", type=int, default=20); ap.add_argument("--freeze_router", action="store_true")
ap.add_argument("--n_eval", type=int, default=256); ap.add_argument("--beta2", type=float, default=0.98)
ap.add_argument("--eps", type=float, default=1e-8); ap.add_argument("--prompts", type=int, default=16)
ap.add_argument("--wd", type=float, default=0.0); ap.add_argument("--kl", type=float, default=0.0)
ap.add_argument("--tag", default="x")
a = ap.parse_args()
torch.set_num_threads(2)
import megatron_glue.trainer as actor_mod
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
from slime_ext.evaluation import evaluate
if a.freeze_router:
    orig = actor_mod.build_gpt_model
    def build(*args, **kw):
        m = orig(*args, **kw)
        n = 0
        for name, p in m.named_parameters():
            if "router" in name:
                p.requires_grad_(False); n += 1
        print("froze", n, "router params")
        return m
    actor_mod.build_gpt_model = build
cfg = load_config("/work/main/configs/grpo.yaml", [f"rollout.prompts_per_step={a.prompts}", f"eval.n_prompts={a.n_eval}"]).config
tok = load_tokenizer(a.hf_dir)
hf_config, src = load_hf_checkpoint(a.hf_dir)
init_distributed(); init_model_parallel(ParallelSizes(), seed=0)
st = TrainerSettings(lr=a.lr, adam_beta2=a.beta2, adam_eps=a.eps, micro_batch_size=16, total_steps=a.steps, weight_decay=a.wd, kl_coef=a.kl)
tr = MegatronTrainer(hf_config, st, ParallelSizes(), pad_id=tok.pad_token_id)
tr.load_local_state_dict(shard_megatron_state(hf_to_megatron(src, hf_config), hf_config, 0, 1))
if a.kl > 0: tr.snapshot_reference()
eng = EmbeddedEngine.from_pretrained(a.hf_dir)
data = prepare_data(cfg.data, "/work/main/.cache/slime_ext")
mgr = RolloutManager(cfg, data.train, tok, eng)
def ev(step):
    r = evaluate(eng, tok, data.eval, cfg.eval, template=cfg.data.template, max_new_tokens=160, seed=0, progress=False)
    d = r.to_dict()
    print(json.dumps({"tag": a.tag, "step": step, **{k: v for k, v in d.items() if isinstance(v, (int, float))}}), flush=True)
ev(0)
rewards = []
for step in range(a.steps):
    groups, m = mgr.rollout(step)
    samples = [s for g in groups for s in g]
    ref = tr.compute_logprobs(samples, reference=True)["logprobs"] if a.kl > 0 else None
    tm = tr.train_step(samples, "grpo", ref_logprobs=ref)
    eng.update_weights_from_tensor(export_hf_state_dict(tr).items())
    rewards.append(m["reward/mean"])
    if (step + 1) % 10 == 0:
        print(f"step {step+1} reward(last10) {statistics.mean(rewards[-10:]):.3f} ent {tm.get('entropy', float('nan')):.4f} gn {tm['grad_norm']:.3f}", flush=True)
    if (step + 1) % a.every == 0:
        ev(step + 1)
