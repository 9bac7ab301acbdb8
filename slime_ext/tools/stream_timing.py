"""When each piece of a streamed answer reaches the user: a checkpoint served by our HTTP server (`slime_ext.serving`,
the same stack as `python -m slime_ext.tools.serve`), prompts streamed one at a time (the latency one user sees, no
batching with others), the arrival time of every streamed delta recorded.

    python -m slime_ext.tools.stream_timing CHECKPOINT --config RUN_DIR/config.yaml --prompts 64 --out timing.jsonl
                                            [--speak-only] [--max-tokens N] [--temperature T]

One JSON line per prompt: `prompt_id`, `level`, `deltas` ([[seconds since the request was sent, text], ...]),
`first_delta_s`, `total_s` (the stream's end). `--speak-only` sends the server's `speak_only` request extension (SxS:
only the speak channel is streamed); without it the whole response is. What counts as the user's first substantive
content is the method's to say (SxS's `seconds_metrics` reads these lines). A first request, not recorded, warms the
engine up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence


def stream_one(base_url: str, prompt: str, params: dict[str, Any], timeout_s: float = 600.0) -> list[list]:
    """[[seconds since sending, text delta], ...] of one streamed chat completion, then [end of stream, ""]."""
    from slime_ext.clients.openai_client import OpenAIClient

    stream = OpenAIClient(base_url, model="policy", timeout_s=timeout_s).stream_chat(
        [{"role": "user", "content": prompt}], **params)
    start = time.perf_counter()  # the request is sent at the first step of the stream
    deltas = [[time.perf_counter() - start, text] for text in stream]
    deltas.append([time.perf_counter() - start, ""])
    return deltas


def stream_timings(checkpoint: str | Path, rows: Sequence[dict], template: str, max_tokens: int,
                   temperature: float = 1.0, seed: int = 0, speak_only: bool = False,
                   progress: bool = True) -> list[dict]:
    """Serve `checkpoint` in this process and stream each row's prompt alone; one record per row."""
    import torch

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.serving import ServerState, serve
    from slime_ext.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    state = ServerState(EmbeddedEngine.from_pretrained(str(checkpoint)), load_tokenizer(checkpoint), "policy",
                        template, max_tokens)
    server = serve(state)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, **({"speak_only": True} if speak_only else {})}
    out = []
    try:
        stream_one(base, rows[0]["prompt"], {**params, "seed": seed})  # warm-up, not recorded
        for i, row in enumerate(rows):
            deltas = stream_one(base, row["prompt"], {**params, "seed": seed + i})
            texts = [d for d in deltas if d[1]]
            out.append({"prompt_id": str(row.get("id", i)), "level": row.get("level"), "deltas": deltas,
                        "first_delta_s": texts[0][0] if texts else None, "total_s": deltas[-1][0]})
            if progress:
                print(f"[stream_timing] {i + 1}/{len(rows)}: {out[-1]['total_s']:.2f} s", file=sys.stderr, flush=True)
    finally:
        server.shutdown()
        state.batcher.close()
    return out


def main(argv: Optional[list[str]] = None) -> int:
    from slime_ext.config import load_config
    from slime_ext.tools.eval_checkpoint import load_rows

    ap = argparse.ArgumentParser(prog="python -m slime_ext.tools.stream_timing", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="HF checkpoint directory with its tokenizer (a run's hf/ or a warm start)")
    ap.add_argument("--config", required=True, help="the run's config.yaml: its held-out prompts and chat template")
    ap.add_argument("--prompts", type=int, default=64, help="the first N held-out prompts")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: the config's rollout.max_response_len")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--speak-only", action="store_true", help="stream the speak channel only (SxS checkpoints)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = load_config(args.config, []).config
    rows = load_rows(cfg, None)[: args.prompts]
    if not rows:
        print(f"error: {args.config} has no held-out prompts", file=sys.stderr)
        return 2
    records = stream_timings(args.checkpoint, rows, cfg.data.template, args.max_tokens or cfg.rollout.max_response_len,
                             args.temperature, args.seed, args.speak_only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"[stream_timing] wrote {len(records)} timelines to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
