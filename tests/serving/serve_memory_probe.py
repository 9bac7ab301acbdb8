"""Time to answer and memory of a server process under K concurrent maximal prompts (issue 28, item 3).

    python tests/serving/serve_memory_probe.py --body-bytes 4089446 --k 16 --cap 4194304 [--repo OLD_CHECKOUT]

Starts `python -m slime_ext.tools.serve --model DIR` (the tiny model of test_serve_token_bound, built
into --model once) from --repo (default: this checkout; pass an extracted older commit to measure it),
sends K bodies of random lowercase words at once (half completions, half chats), and prints each
answer's time, the peak RSS growth (VmHWM after a reset through /proc/PID/clear_refs) and the RSS left
2 s after the answers. Linux only. docs/serving.md's table was measured with it.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from tests.serving.test_serve_token_bound import CORPUS, body_of, memory_mib, reset_peak  # noqa: E402


def build_model(d: Path) -> None:
    """The tiny model and tokenizer the tests serve (kept in `d` across runs)."""
    if (d / "config.json").exists():
        return
    import torch
    from transformers import AutoModelForCausalLM

    from slime_ext.tokenizer import train_tokenizer
    from tests.megatron_fixtures import tiny_moe_config

    tok = train_tokenizer(CORPUS, vocab_size=300, out_dir=d)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_moe_config(vocab_size=len(tok))).save_pretrained(d)


def start(repo: Path, model: Path, cap: int | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "slime_ext.tools.serve", "--model", str(model), "--port", str(port)]
    argv += ["--max-request-bytes", str(cap)] if cap else []
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(proc.stderr.read().decode()[-3000:])
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)


def send(url: str, path: str, raw: bytes) -> tuple[int, str, float]:
    t0 = time.monotonic()
    r = httpx.post(url + path, content=raw, headers={"Content-Type": "application/json"}, timeout=600)
    return r.status_code, (r.json().get("error") or {}).get("code"), time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--body-bytes", type=int, required=True)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--cap", type=int, default=None, help="--max-request-bytes (default: the server's)")
    ap.add_argument("--model", type=Path, default=Path("/tmp/serve_memory_probe_model"))
    ap.add_argument("--repo", type=Path, default=HERE)
    a = ap.parse_args()
    build_model(a.model)
    bodies = [("/v1/chat/completions" if i % 2 else "/v1/completions", body_of(a.body_bytes, bool(i % 2), seed=i))
              for i in range(a.k)]
    proc, url = start(a.repo, a.model, a.cap)
    try:
        print("warm-up", send(url, "/v1/completions", b'{"prompt": "the cat", "max_tokens": 1}'))
        time.sleep(0.5)
        reset_peak(proc.pid)
        before = memory_mib(proc.pid)["VmRSS"]
        with cf.ThreadPoolExecutor(a.k) as pool:
            answers = list(pool.map(lambda b: send(url, *b), bodies))
        peak = memory_mib(proc.pid)["VmHWM"]
        time.sleep(2.0)
        left = memory_mib(proc.pid)["VmRSS"] - before
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    print(f"{a.k} x {a.body_bytes} B (cap {a.cap or 'default'}): answers {sorted({(s, c) for s, c, _ in answers})}, "
          f"{min(t for *_, t in answers):.2f}-{max(t for *_, t in answers):.2f} s; RSS {before:.0f} MiB, "
          f"peak +{peak - before:.0f} MiB, left after 2 s {left:.0f} MiB")


if __name__ == "__main__":
    main()
