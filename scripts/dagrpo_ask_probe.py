"""Does a DA-GRPO checkpoint's decision to ask depend on the prompt?

    python scripts/dagrpo_ask_probe.py CHECKPOINT_HF_DIR [...] [--levels L1 L4] [--n 48] [k=v ...]

For held-out prompts of each level, the probability that the model writes the help trigger right after
the reference solution's first step (the point where the warm start learned to ask). A policy that
learned *where* to ask gives different numbers per level and a wide spread across prompts; one shared
bias gives the same narrow band everywhere. Overrides (k=v) go to configs/dagrpo.yaml, e.g.
run.cache_dir=... so the held-out rows come from the same data cache as the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def trigger_probabilities(model, tok, prompts: list[str], first_steps: list[str], trigger: str, template) -> torch.Tensor:
    trig = tok(trigger)["input_ids"]
    out = []
    for prompt, first in zip(prompts, first_steps):
        ids = tok(template.format(prompt))["input_ids"] + tok(first + "\n")["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids + trig])).logits[0, :-1].float(), -1)
        out.append(float(sum(logp[len(ids) - 1 + k, t] for k, t in enumerate(trig)).exp()))
    return torch.tensor(out)


def main(argv=None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_ext.config.loader import load_config
    from slime_ext.methods.dagrpo.method import load_rows
    from slime_ext.tasks.templates import get_template

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("items", nargs="+", metavar="CHECKPOINT_OR_K=V", help="checkpoint dirs, then config overrides")
    ap.add_argument("--levels", nargs="+", default=["L1", "L4"])
    ap.add_argument("--n", type=int, default=48, help="held-out prompts per level")
    args = ap.parse_args(argv)
    checkpoints = [Path(x) for x in args.items if Path(x).is_dir()]  # run dirs may contain "="
    overrides = [x for x in args.items if not Path(x).is_dir()]
    cfg = load_config(REPO / "configs" / "dagrpo.yaml", overrides).config
    template = get_template(cfg.data.template)
    torch.set_num_threads(1)
    held_out = {level: load_rows(cfg, [level])[1][: args.n] for level in args.levels}  # once, for every checkpoint
    for path in checkpoints:
        if not (path / "config.json").is_file():  # a directory, but not a checkpoint
            raise SystemExit(f"{path}: not a Hugging Face checkpoint directory (no config.json); pass a run's hf/ "
                             "directory or a warm start's")
        tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path).eval()
        row = {"checkpoint": str(path)}
        for level, rows in held_out.items():
            p = trigger_probabilities(model, tok, [r["prompt"] for r in rows],
                                      [r["solution"].split("\n")[0] for r in rows], cfg.dagrpo.trigger, template)
            q = p.quantile(torch.tensor([0.1, 0.5, 0.9])).tolist()
            row[level] = {"mean": round(p.mean().item(), 3), "p10": round(q[0], 3), "median": round(q[1], 3),
                          "p90": round(q[2], 3)}
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
