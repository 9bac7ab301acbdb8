"""One rollout engine server process, owned by a Ray actor placed where the plan puts that engine.

The host is chosen by what the machine has:
- a CUDA machine with `sglang` importable: `python -m sglang.launch_server` (flags from the `sglang`
  config section, checked against sglang's own parser by `sglang_launcher.build_server_command`);
- otherwise: the project's SGLang-protocol server over the embedded engine (`python -m
  slime_ext.tools.serve`), which speaks the same routes (/generate, /abort_request, /flush_cache, the
  weight-update routes, /health, /model_info).

Either way the loop drives it only through `SGLangEngineClient`. The actor keeps the port across restarts
(the URL the clients hold stays valid) and restores the newest weights after a restart: it starts the
server from the base checkpoint (config and tokenizer live there) and loads the newest weight snapshot
from disk with the version it had (`restart(snapshot_dir, version)`).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from slime_ext.engine.sglang_launcher import SGLangServer, build_server_command

log = logging.getLogger(__name__)

STANDIN = "slime_ext.tools.serve"
INITIAL_VERSION = "0"  # the version of the weights a run's engines start with (the warm start)


def sglang_host_available() -> bool:
    """True where real SGLang servers can run: CUDA present and sglang importable."""
    if importlib.util.find_spec("sglang") is None:
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def listen_host(host: str) -> str:
    """`sglang.host` resolved: "node" is the calling process's node address (Ray's view, never assumed to be
    the loopback), anything else is used as given."""
    if host != "node":
        return host
    from slime_ext.engine.weight_sync import node_address

    return node_address()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def engine_dtype(precision: Optional[str]) -> Optional[str]:
    """`rollout.precision` as the engines' `--dtype` (None: the engine's own default)."""
    return {"fp32": "float32", "bf16": "bfloat16", None: None}[precision]


def server_command(cfg_sglang: Any, model_dir: str, port: int, *, threads: int = 1,
                   partner_dir: Optional[str] = None, weight_version: str = INITIAL_VERSION,
                   use_sglang: Optional[bool] = None, dtype: Optional[str] = None,
                   kernel: str = "auto", memory_saver: bool = False,
                   lora_args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of one engine server. `dtype` (float32 / bfloat16; None: the server's default,
    the checkpoint's dtype on SGLang and float32 on the CPU server) is passed as `--dtype`; `kernel`
    (rollout.engine_kernel) as the CPU server's `--kernel` (SGLang has its own kernels: only auto). `lora_args`:
    SGLang's LoRA flags (`lora_sync.sglang_lora_args`; the project's server serves an adapter without flags)."""
    host = listen_host(cfg_sglang.host)
    if use_sglang if use_sglang is not None else sglang_host_available():
        if kernel != "auto":
            raise ValueError(f"rollout.engine_kernel = {kernel!r} selects the embedded engine's forward, but the "
                             "engines are SGLang servers, which run their own kernels: leave it at 'auto'")
        env = {}
        if partner_dir:  # the two-model tandem engine (sglang_patches.tandem_model) serves the pair
            from sglang_patches.tandem_model import write_tandem_checkpoint

            model_dir = str(write_tandem_checkpoint(model_dir, partner_dir, Path(model_dir).parent / "tandem_pair"))
            env["SGLANG_EXTERNAL_MODEL_PACKAGE"] = "sglang_patches.tandem_model"
        # colocated sleep: SGLang frees memory on /release_memory_occupation only with its memory saver
        argv = build_server_command(cfg_sglang, model_dir, port, host, enable_memory_saver=memory_saver)
        argv += ["--weight-version", weight_version] + (["--dtype", dtype] if dtype else []) + list(lora_args)
        return argv, env
    argv = [sys.executable, "-m", STANDIN, "--model", str(model_dir), "--host", host, "--port", str(port),
            "--threads", str(threads), "--weight-version", weight_version, "--max-batch", "1024",
            "--max-concurrency", "1024", "--max-queue", "4096",
            # an RL step's requests arrive as one burst: batch it whole (20 ms gaps, at most 2 s)
            "--batch-window-ms", "20", "--batch-settle-ms", "2000"]
    if partner_dir:
        argv += ["--partner", str(partner_dir)]
    if dtype:
        argv += ["--dtype", dtype]
    if kernel != "auto":
        argv += ["--kernel", kernel]
    return argv, {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the actor process dies (ray.kill sends SIGKILL to the actor,
    which would otherwise orphan the server)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EngineServerActor:
    """Owns one engine server subprocess (run as a Ray actor; a plain object in tests)."""

    def __init__(self, index: int, cfg_sglang: Any, model_dir: str, *, threads: int = 1,
                 partner_dir: Optional[str] = None, log_dir: Optional[str] = None,
                 use_sglang: Optional[bool] = None, dtype: Optional[str] = None, kernel: str = "auto",
                 memory_saver: bool = False, lora_args: Sequence[str] = ()):
        self.index = index
        self.lora_args = list(lora_args)
        self.memory_saver = memory_saver
        self.dtype = dtype
        self.kernel = kernel
        self.cfg = cfg_sglang
        self.model_dir = str(model_dir)
        self.threads = threads
        self.partner_dir = partner_dir
        self.use_sglang = use_sglang
        self.host = listen_host(cfg_sglang.host)  # "node": this actor's node address, as Ray knows it
        self.port = cfg_sglang.base_port + index if cfg_sglang.base_port else free_port(self.host)
        self.log_path = str(Path(log_dir) / f"engine_{index}.log") if log_dir else None
        self.server: Optional[SGLangServer] = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, weight_version: str = INITIAL_VERSION) -> str:
        """Start the server and wait for /health; returns its URL."""
        argv, env = server_command(self.cfg, self.model_dir, self.port, threads=self.threads,
                                   partner_dir=self.partner_dir, weight_version=weight_version,
                                   use_sglang=self.use_sglang, dtype=self.dtype, kernel=self.kernel,
                                   memory_saver=self.memory_saver, lora_args=self.lora_args)
        self.server = SGLangServer(argv, self.host, self.port, startup_timeout_s=self.cfg.startup_timeout_s,
                                   poll_interval_s=0.2, env=env, log_path=self.log_path,
                                   preexec_fn=_die_with_parent)
        self.server.start()
        self.server.wait_healthy()
        log.info("engine %d serving at %s (pid %d)", self.index, self.url, self.server.proc.pid)
        return self.url

    def restart(self, snapshot_dir: Optional[str], weight_version: str) -> str:
        """Stop whatever is left of the server, start it again on the same port and restore the newest
        weights (`snapshot_dir`, HF safetensors) under their version."""
        self.restarts += 1
        self.stop()
        url = self.start(weight_version if snapshot_dir is None else INITIAL_VERSION)
        if snapshot_dir is not None:
            from slime_ext.engine.sglang_client import SGLangEngineClient

            SGLangEngineClient(url, validate=False).update_weights_from_disk(snapshot_dir, weight_version=weight_version)
        return url

    def host_kind(self) -> str:
        """"sglang" (a real SGLang server) or "standin" (the project's server): the client's tandem mode differs."""
        use = self.use_sglang if self.use_sglang is not None else sglang_host_available()
        return "sglang" if use else "standin"

    def memory_in_use(self) -> int:
        """Bytes the engine holds now: the GPU memory in use on this node's visible devices (NVML) where CUDA is,
        else the server process tree's resident memory. The pool reads it around a release (released bytes)."""
        if self.server is None or self.server.proc is None:
            return 0
        try:
            import torch

            if torch.cuda.is_available():
                import pynvml

                pynvml.nvmlInit()
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                indices = [int(i) for i in visible.split(",")] if visible else range(pynvml.nvmlDeviceGetCount())
                return sum(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used for i in indices)
        except Exception as exc:  # noqa: BLE001 - no NVML: the host view below
            log.debug("NVML unavailable (%s): measuring resident memory", exc)
        import psutil

        try:
            root = psutil.Process(self.server.proc.pid)
            return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return 0

    def restart_count(self) -> int:
        return self.restarts

    def pid(self) -> Optional[int]:
        return None if self.server is None or self.server.proc is None else self.server.proc.pid

    def alive(self) -> bool:
        return self.server is not None and self.server.proc is not None and self.server.proc.poll() is None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace_s=10.0)
            self.server = None

    def __del__(self) -> None:  # best effort; PR_SET_PDEATHSIG covers a killed actor
        try:
            self.stop()
        except Exception:  # noqa: BLE001
            pass


__all__ = ["EngineServerActor", "server_command", "listen_host", "sglang_host_available", "free_port", "INITIAL_VERSION"]
