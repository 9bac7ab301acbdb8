"""Weight conversion between HF Qwen3 / Qwen3-MoE checkpoints and Megatron-core GPTModel state dicts.

The command-line tool. The work is done by `megatron_glue.weight_names` (HF <-> full Megatron
names), `megatron_glue.sharding` (TP / EP / PP rank shards) and `megatron_glue.checkpoint_io`
(checkpoint directories).

CLI:
    python -m megatron_glue.convert --to megatron --hf-dir IN --out OUT --tp 2 --ep 2 --pp 1
    python -m megatron_glue.convert --to hf --megatron-dir IN --out OUT
The Megatron directory holds one `torch.save` file per rank, `mp_rank_{tp:02d}_{ep:03d}_{pp:03d}.pt`,
and `megatron_meta.json` (format, sizes, HF config dict).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from megatron_glue.checkpoint_io import (
    META_FILE,
    cast_state_dict,
    load_hf_checkpoint,
    load_megatron_checkpoint,
    megatron_shard_file,
    save_hf_checkpoint,
    write_megatron_meta,
)
from megatron_glue.sharding import check_expert_tp_size, check_parallel_sizes, gather_megatron_states, shard_megatron_state
from megatron_glue.weight_names import hf_to_megatron, megatron_to_hf

__all__ = ["main"]


_DTYPES = {"keep": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _to_megatron(args: argparse.Namespace) -> None:
    hf_config, src = load_hf_checkpoint(args.hf_dir)
    print(f"[convert] {args.hf_dir}: {type(hf_config).__name__}, {len(src)} tensors", flush=True)
    check_parallel_sizes(hf_config, args.tp, args.ep, args.pp)
    etp = check_expert_tp_size(args.tp, args.etp)
    full = cast_state_dict(hf_to_megatron(src, hf_config), _DTYPES[args.dtype])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = args.tp * args.ep * args.pp
    i = 0
    for p in range(args.pp):
        for e in range(args.ep):
            for t in range(args.tp):
                i += 1
                shard = shard_megatron_state(full, hf_config, t, args.tp, e, args.ep, p, args.pp, etp_size=etp)
                f = out / megatron_shard_file(t, e, p)
                torch.save(shard, f)
                n_t = sum(v is not None for v in shard.values())
                print(f"[convert] ({i}/{n}) wrote {f} ({n_t} tensors)", flush=True)
                del shard
    write_megatron_meta(out, {"tp": args.tp, "ep": args.ep, "pp": args.pp, "etp": etp, "source": str(args.hf_dir)}, hf_config)
    print(f"[convert] wrote {out / META_FILE}", flush=True)


def _to_hf(args: argparse.Namespace) -> None:
    hf_config, shards, meta = load_megatron_checkpoint(args.megatron_dir)
    tp, ep, pp = int(meta["tp"]), int(meta["ep"]), int(meta["pp"])
    etp = int(meta.get("etp", tp))
    print(f"[convert] {args.megatron_dir}: {type(hf_config).__name__}, tp={tp} ep={ep} pp={pp} etp={etp}", flush=True)
    full = gather_megatron_states(shards, hf_config, tp, ep, pp, etp_size=etp)
    hf = cast_state_dict(megatron_to_hf(full, hf_config), _DTYPES[args.dtype])
    save_hf_checkpoint(
        args.out, hf_config, hf, shard_size_mb=args.shard_size_mb, log=lambda s: print(f"[convert] {s}", flush=True)
    )
    print(f"[convert] wrote {Path(args.out) / 'config.json'}", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m megatron_glue.convert", description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", choices=["megatron", "hf"], required=True)
    ap.add_argument("--hf-dir", help="input HF checkpoint directory (--to megatron)")
    ap.add_argument("--megatron-dir", help="input Megatron checkpoint directory (--to hf)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--etp", type=int, default=None,
                    help="expert tensor-parallel size: 1 (experts whole on each TP rank) or the TP size (default)")
    ap.add_argument("--dtype", choices=sorted(_DTYPES), default="keep")
    ap.add_argument("--shard-size-mb", type=float, default=4096, help="max safetensors file size (--to hf)")
    args = ap.parse_args(argv)
    try:
        if args.to == "megatron":
            if not args.hf_dir:
                ap.error("--to megatron needs --hf-dir")
            _to_megatron(args)
        else:
            if not args.megatron_dir:
                ap.error("--to hf needs --megatron-dir")
            _to_hf(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"[convert] error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
