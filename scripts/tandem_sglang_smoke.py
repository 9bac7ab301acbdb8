"""GPU smoke test of Tandem's two-model SGLang path (run on a GPU machine with sglang installed).

    python scripts/tandem_sglang_smoke.py SENIOR_HF_DIR JUNIOR_HF_DIR [--port 30123] [--n 16]

It packages the pair (`sglang_patches.tandem_model.write_tandem_checkpoint`), starts one SGLang server
with `SGLANG_EXTERNAL_MODEL_PACKAGE=sglang_patches.tandem_model`, sends tandem requests through our
client (`partner_vocab` = V) and checks, against HF transformers forwards of the two checkpoints:

1. every returned token's logprob equals its author's teacher-forced logprob (senior tokens under the
   senior, junior tokens under the junior; tolerance --atol). This is what verifies the shared block
   table with separate KV layers: a junior reading the senior's KV (or stale KV) fails it;
2. authors (replayed from seed + tokens) switch only after boundary tokens or kappa tokens and the
   senior's share of author draws is near p;
3. a solo request (no sampler) returns only senior-authored logprobs (the junior half is unreachable);
4. `update_weights_from_tensor` with the senior's own weights keeps outputs identical (same seeds),
   and a name under `junior.` is refused (the junior stays frozen).

What only this script (a live server) can verify, and the CPU tests cannot: SGLang building the
out-of-tree model, its KV pool sized for 2L layers, both stacks running under CUDA graphs, the logits
width 2V passing SGLang's sampler and logprob code, and the weight-update path reaching `load_weights`.
Exit status 0 when every check passes; the report is printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_patches.request_sampler import replay_annotations
    from sglang_patches.decoding import SamplingParams
    from sglang_patches.tandem import boundary_ids_from_vocab
    from sglang_patches.tandem_model import write_tandem_checkpoint
    from slime_ext.data.generation import GenerateRequest
    from slime_ext.engine.sglang_client import SGLangEngineClient
    from slime_ext.engine.sglang_launcher import SGLangServer, build_server_command

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("senior")
    ap.add_argument("junior")
    ap.add_argument("--port", type=int, default=30123)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--atol", type=float, default=2e-2)
    args = ap.parse_args(argv)

    tok = AutoTokenizer.from_pretrained(args.senior)
    vocab = len(tok)
    boundary = boundary_ids_from_vocab(tok.get_vocab())
    spec = {"kind": "tandem", "p_senior": 0.5, "kappa": 8, "boundary_ids": boundary}
    pair = write_tandem_checkpoint(args.senior, args.junior, Path(tempfile.mkdtemp()) / "pair")
    cmd = build_server_command({"tp_size": 1, "mem_fraction_static": 0.5,
                                "extra_server_args": ["--trust-remote-code"]}, str(pair), args.port)
    env = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "sglang_patches.tandem_model"}
    report: dict = {"command": cmd, "checks": {}}
    prompts = [tok(f"Question {i}: what is {i} + {i}?\nAnswer:")["input_ids"] for i in range(args.n)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    with SGLangServer(cmd, port=args.port, env=env, log_path=str(pair / "server.log")) as server:
        client = SGLangEngineClient(server.base_url, eos_token_id=tok.eos_token_id, partner_vocab=vocab)
        reqs = [GenerateRequest(f"t{i}", p, sp, seed=100 + i, sampler_specs=[spec]) for i, p in enumerate(prompts)]
        results = client.generate(reqs)
        solo = client.generate([GenerateRequest(f"s{i}", p, sp, seed=200 + i) for i, p in enumerate(prompts[:4])])
        client.update_weights_from_tensor(list(_hf_weights(args.senior)))
        again = client.generate([GenerateRequest(f"u{i}", r.input_ids, sp, seed=r.seed, sampler_specs=[spec])
                                 for i, r in enumerate(reqs)])
        try:
            client.update_weights_from_tensor([("junior.lm_head.weight", torch.zeros(1))])
            report["checks"]["junior_update_refused"] = False
        except Exception as exc:  # noqa: BLE001 - the server must refuse it
            report["checks"]["junior_update_refused"] = "junior" in str(exc)

    senior = AutoModelForCausalLM.from_pretrained(args.senior).eval()
    junior = AutoModelForCausalLM.from_pretrained(args.junior).eval()
    worst, draws, senior_draws = 0.0, 0, 0
    for req, res in zip(reqs, results):
        notes = replay_annotations([spec], req.seed, req.input_ids, res.output_ids, tok.eos_token_id)
        ids = torch.tensor([req.input_ids + res.output_ids])
        with torch.no_grad():
            lp = {1: torch.log_softmax(senior(ids).logits[0].float(), -1),
                  0: torch.log_softmax(junior(ids).logits[0].float(), -1)}
        for t, (token, note) in enumerate(zip(res.output_ids, notes)):
            ref = float(lp[note["author"]][len(req.input_ids) - 1 + t, token])
            worst = max(worst, abs(ref - res.logprobs[t]))
            if note["author_drawn"]:
                draws += 1
                senior_draws += note["author"]
    report["checks"]["author_logprobs_max_abs_err"] = worst
    report["checks"]["author_logprobs_ok"] = worst < args.atol
    share = senior_draws / max(draws, 1)
    report["checks"]["senior_draw_share"] = share
    report["checks"]["senior_draw_share_ok"] = abs(share - 0.5) < 4 * (0.25 / max(draws, 1)) ** 0.5
    solo_err = 0.0
    for req_prompt, res in zip(prompts[:4], solo):
        ids = torch.tensor([req_prompt + res.output_ids])
        with torch.no_grad():
            lp = torch.log_softmax(senior(ids).logits[0].float(), -1)
        solo_err = max([solo_err] + [abs(float(lp[len(req_prompt) - 1 + t, tk]) - res.logprobs[t])
                                     for t, tk in enumerate(res.output_ids)])
    report["checks"]["solo_is_senior"] = solo_err < args.atol
    report["checks"]["same_after_self_update"] = [r.output_ids for r in again] == [r.output_ids for r in results]
    ok = all(v for k, v in report["checks"].items() if k.endswith(("_ok", "_refused", "_is_senior", "_update")))
    print(json.dumps(report, indent=2, default=str))
    return 0 if ok else 1


def _hf_weights(path: str):
    from safetensors.torch import load_file

    for f in sorted(Path(path).glob("*.safetensors")):
        yield from load_file(str(f)).items()


if __name__ == "__main__":
    raise SystemExit(main())
