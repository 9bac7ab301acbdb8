"""An OpenAI-compatible + SGLang-native HTTP server over the embedded engine:
`python -m slime_ext.tools.serve --model HF_DIR`.

Routes (the subset of OpenAI's and SGLang's APIs this project's clients use, same schemas):
- `POST /v1/chat/completions`, `POST /v1/completions` (`stream: true` gives server-sent events ending in
  `data: [DONE]`; the extension `speak_only: true` runs SxS's channel sampler and returns / streams only
  the speak channel), `GET /v1/models`;
- `POST /generate`: SGLang's native token-id route (`input_ids`, `sampling_params` incl. `sampling_seed`
  and `custom_params`, `return_logprob`, `rid`), answered like SGLang, so `SGLangEngineClient` talks to
  this server and to a real SGLang server alike;
- `POST /abort_request`, `POST /flush_cache`, `GET /health`;
- SGLang's weight routes (`/update_weights_from_disk`, `/update_weights_from_tensor`, `/begin_weight_update`,
  `/end_weight_update`, `/init_weights_update_group`, `/update_weights_from_distributed`,
  `/destroy_weights_update_group`, `/update_weight_version`, `/release_memory_occupation`,
  `/resume_memory_occupation`) and `GET /model_info`, so a trainer updates this server as an SGLang engine
  server; `meta_info.weight_version` tells which weights generated an answer (`--weight-version` at start).
  `--partner DIR` loads a partner model beside the policy (Tandem's junior): partner samplers run here.

It runs on FastAPI + uvicorn (`slime_ext/serving/`) with bounded request sizes, context-length checks,
bounded concurrency with a 429 queue, idle timeouts and an optional API key; concurrent requests are
batched into one `generate` call on a single worker thread. This module is the CLI and re-exports the
in-process API (`ServerState`, `serve`) that tests and `solver:` endpoints use.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional

from slime_ext.serving import Batcher, RunningServer, ServeConfig, ServerState, build_app, serve, serve_forever
from slime_ext.serving.state import FINISH_OPENAI, BadRequest

log = logging.getLogger("slime_ext.tools.serve")

__all__ = ["Batcher", "BadRequest", "FINISH_OPENAI", "RunningServer", "ServeConfig", "ServerState", "build_app",
           "serve", "main"]


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    d = ServeConfig()
    ap = argparse.ArgumentParser(prog="python -m slime_ext.tools.serve", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF checkpoint directory (with its tokenizer)")
    src.add_argument("--solver", choices=["synthetic_math", "synthetic_math_answer"],
                     help="serve an exact solver instead of a model (DA-GRPO's embedded 'cloud')")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--template", default="plain", help="chat rendering: plain (Question/Answer) or qwen_chat")
    ap.add_argument("--max-tokens", type=int, default=256, help="default completion length (clipped to the context)")
    ap.add_argument("--max-batch", type=int, default=64, help="requests per engine.generate call")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--name", "--served-model-name", dest="name", default=None,
                    help="model name reported by /v1/models and /model_info (default: the path)")
    ap.add_argument("--partner", default=None,
                    help="HF checkpoint of a partner model run beside the policy (Tandem's junior); requests whose "
                         "samplers need a partner are served only with one")
    ap.add_argument("--kernel", choices=["auto", "static", "hf"], default="auto",
                    help="the embedded engine's forward: static-KV (auto: where it models the architecture) or "
                         "transformers' (hf); rollout.engine_kernel")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="weights and activations of the served model (SGLang's flag; bfloat16 reproduces a GPU engine's "
                         "precision against an fp32 trainer)")
    ap.add_argument("--weight-version", default="default",
                    help="the version of the weights served at start (SGLang's flag; updates move it)")
    lim = ap.add_argument_group("limits")
    lim.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes,
                     help="largest request body (default: on the prompt routes, enough for a maximal prompt as "
                          "JSON, from the prompt token limit and the tokenizer's longest token, at most 4 MiB; "
                          "4 MiB elsewhere)")
    lim.add_argument("--context-length", type=int, default=None,
                     help="prompt + max tokens limit (default: the model's max_position_embeddings)")
    lim.add_argument("--max-prompt-tokens", type=int, default=None, help="prompt token limit (default: the context)")
    lim.add_argument("--max-concurrency", type=int, default=d.max_concurrency,
                     help="requests being tokenised or generated at once")
    lim.add_argument("--max-queue", type=int, default=d.max_queue, help="requests waiting for a slot; more get 429")
    lim.add_argument("--queue-timeout", type=float, default=d.queue_timeout_s, help="seconds in the queue before 429")
    lim.add_argument("--body-timeout", type=float, default=d.body_timeout_s, help="seconds to receive a request body")
    lim.add_argument("--header-timeout", type=float, default=d.header_timeout_s,
                     help="seconds a new connection has to send its first request")
    lim.add_argument("--keep-alive", type=float, default=d.keep_alive_s, help="idle keep-alive connection timeout")
    lim.add_argument("--max-connections", type=int, default=d.max_connections,
                     help="open connections + requests beyond which new requests get 503")
    lim.add_argument("--backlog", type=int, default=d.backlog, help="listen backlog")
    lim.add_argument("--batch-window-ms", type=float, default=d.batch_window_s * 1e3,
                     help="how long the first request waits for others to batch with")
    lim.add_argument("--batch-settle-ms", type=float, default=None,
                     help="restart the batch window with every arrival, up to this long in all (bursts)")
    lim.add_argument("--no-continuous-batching", dest="continuous_batching", action="store_false",
                     help="run every generate call's batch to the end (requests arriving meanwhile wait for it)")
    lim.add_argument("--admit-min-share", type=float, default=d.admit_min_share,
                     help="waiting requests join a running batch once they are this share of it ...")
    lim.add_argument("--admit-max-wait-ms", type=float, default=d.admit_max_wait_s * 1e3,
                     help="... or once the oldest has waited this long")
    lim.add_argument("--max-n", type=int, default=d.max_n, help="most choices (n) per request")
    lim.add_argument("--api-key", default=os.environ.get("SLIME_SERVE_API_KEY"),
                     help="require 'Authorization: Bearer KEY' on every route but /health "
                          "(default: $SLIME_SERVE_API_KEY; unset = no key)")
    return ap.parse_args(argv)


def config_from(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        max_request_bytes=args.max_request_bytes, max_prompt_tokens=args.max_prompt_tokens,
        context_length=args.context_length, max_concurrency=args.max_concurrency, max_queue=args.max_queue,
        queue_timeout_s=args.queue_timeout, body_timeout_s=args.body_timeout, header_timeout_s=args.header_timeout,
        keep_alive_s=args.keep_alive, batch_window_s=args.batch_window_ms / 1e3,
        batch_settle_s=None if args.batch_settle_ms is None else args.batch_settle_ms / 1e3, max_connections=args.max_connections, backlog=args.backlog, max_n=args.max_n,
        api_key=args.api_key or None, continuous_batching=args.continuous_batching,
        admit_min_share=args.admit_min_share, admit_max_wait_s=args.admit_max_wait_ms / 1e3)


def limits_line(state: ServerState) -> str:
    """The effective body caps and prompt bound, logged at start (the byte cap may be derived)."""
    how = "--max-request-bytes" if state.config.max_request_bytes is not None else "derived"
    line = (f"request bodies: prompt routes {state.max_request_bytes} bytes ({how}), "
            f"others {state.max_control_bytes} bytes")
    if state.max_prompt_chars is None:
        return line + "; no character bound for this tokenizer or no prompt token limit: prompts are tokenised whole"
    return (line + f"; prompts over {state.max_prompt_chars} characters ({state.max_prompt_tokens} tokens x "
            f"{state.chars_per_token} characters per token) are refused before tokenising")


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.partner and args.solver:
        print("error: --partner needs --model", file=sys.stderr)
        return 2
    import torch

    from slime_ext.engine.embedded import EmbeddedEngine
    from slime_ext.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    if args.solver:
        from slime_ext.engine.solver import SolverEngine

        engine = SolverEngine(args.solver)
        tokenizer = engine.tokenizer
    else:
        try:
            tokenizer = load_tokenizer(args.model)
            engine = EmbeddedEngine.from_pretrained(args.model, partner_path=args.partner,
                                                    dtype=getattr(torch, args.dtype), kernel=args.kernel)
        except (OSError, ValueError) as exc:
            which = f"--model {args.model}" + (f" / --partner {args.partner}" if args.partner else "")
            print(f"error: {which}: {exc}", file=sys.stderr)
            return 2
    source = args.model or f"solver:{args.solver}"
    state = ServerState(engine, tokenizer, args.name or source, args.template, args.max_tokens, args.max_batch,
                        config=config, model_path=source, tokenizer_path=args.model, weight_version=args.weight_version)
    log.info("serving %s%s on http://%s:%d (OpenAI /v1/*, SGLang /generate + weight updates; weight version %s; "
             "context %s, concurrency %d + queue %d%s)", source,
             f" with partner {args.partner}" if args.partner else "", args.host, args.port, args.weight_version,
             state.context_length, config.max_concurrency, config.max_queue,
             ", API key required" if config.api_key else "")
    log.info(limits_line(state))
    try:
        serve_forever(state, args.host, args.port)
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled after its graceful shutdown
        log.info("stopped")
    finally:
        state.batcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
