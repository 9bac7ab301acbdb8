"""Launch SGLang servers from the `sglang` config section and wait until they serve.

The command is `python -m sglang.launch_server` with flags whose names are checked against sglang's own
argument parser and `ServerArgs` fields (sglang 0.5.21: `ServerArgs` is a msgspec Struct assembled from
`srt/arg_groups/fields/*`; `ServerArgs.add_cli_args` builds the parser). Extra server args from the
config pass through verbatim but are checked the same way, so a misspelt flag fails here with its name
instead of in a log on a remote node. When `sglang.srt.server_args` cannot be imported the field names
are read from its source with `ast` (flag `--tp-size` -> field `tp_size`).

Flag choices:
- `--enable-custom-logit-processor` (config) brings `--disable-overlap-schedule`: our samplers read
  `req.output_ids` each step, which the overlap scheduler updates one step late;
- no `--skip-tokenizer-init`: we send and receive token ids either way (`output_ids` is in every
  /generate response), and keeping the tokenizer lets requests use stop strings;
- reproducible draws per `sampling_seed` need `--enable-deterministic-inference` (and
  `--sampling-backend pytorch` with top-p/top-k); not on by default (slower): pass them in
  extra_server_args;
- `SGLANG_RETURN_ORIGINAL_LOGPROB=1` in the server environment: returned logprobs are then the
  temperature-1 log-softmax (what the embedded engine reports) rather than the temperature-scaled one.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional, Sequence

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ENV = {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1"}


class ServerArgsError(ValueError):
    """A flag that sglang's launch_server would not accept."""


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print and exit(2)
        raise ServerArgsError(f"sglang launch_server rejects the arguments: {message}")


@lru_cache(maxsize=1)
def _sglang_cli() -> tuple[Optional[argparse.ArgumentParser], frozenset[str], dict[str, str]]:
    """(parser or None, ServerArgs field names, flag -> field) from sglang itself, else from its source."""
    try:
        import msgspec
        from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # noqa: BLE001 - fall back to reading the source
        logger.info("sglang.srt.server_args does not import (%s); reading its fields with ast", exc)
        fields = _ast_server_arg_fields()
        return None, fields, {"--" + f.replace("_", "-"): f for f in fields}
    parser = _RaisingParser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    fields = frozenset(f.name for f in msgspec.structs.fields(ServerArgs))
    flags = {opt: action.dest for action in parser._actions for opt in action.option_strings}
    return parser, fields, flags


def _ast_server_arg_fields() -> frozenset[str]:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed: cannot check server flags")
    root = Path(list(spec.submodule_search_locations)[0]) / "srt"
    files = [root / "server_args.py", *sorted((root / "arg_groups" / "fields").glob("*.py"))]
    names: set[str] = set()
    for path in files:
        if not path.exists():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names.update(s.target.id for s in node.body
                             if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                             and not s.target.id.startswith("_"))
    return frozenset(names)


def server_arg_fields() -> frozenset[str]:
    return _sglang_cli()[1]


def validate_server_args(args: Sequence[str]) -> None:
    """Every `--flag` must be a launch_server flag mapping to a ServerArgs field; values are parsed by
    sglang's parser when it is importable. Raises ServerArgsError naming the offending flag."""
    parser, fields, flags = _sglang_cli()
    for arg in args:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        if flag not in flags:
            raise ServerArgsError(f"unknown sglang server flag {flag!r} (not an option of sglang.launch_server)")
        if flags[flag] not in fields and flag != "--config":
            raise ServerArgsError(f"sglang server flag {flag!r} maps to {flags[flag]!r}, not a ServerArgs field")
    if parser is not None:
        parser.parse_args(list(args))


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def build_server_command(cfg_sglang: Any, model_path: Optional[str], port: int, host: str = "127.0.0.1", *,
                         enable_memory_saver: bool = False, validate: bool = True,
                         python: Optional[str] = None) -> list[str]:
    """argv for one SGLang server from an `SGLangConfig` (or a dict with its fields)."""
    model = model_path or _get(cfg_sglang, "model_path")
    if not model:
        raise ValueError("no model path for the SGLang server (sglang.model_path or the model_path argument)")
    args = [
        "--model-path", str(model),
        "--tp-size", str(int(_get(cfg_sglang, "tp_size", 1))),
        "--mem-fraction-static", str(float(_get(cfg_sglang, "mem_fraction_static", 0.8))),
        "--host", str(host),
        "--port", str(int(port)),
    ]
    extra = [str(a) for a in (_get(cfg_sglang, "extra_server_args", None) or [])]
    if _get(cfg_sglang, "enable_custom_logit_processor", True):
        args.append("--enable-custom-logit-processor")
        if "--disable-overlap-schedule" not in extra:
            args.append("--disable-overlap-schedule")
    if _get(cfg_sglang, "weight_sync", "disk") == "tensor" and _get(cfg_sglang, "weight_sync_delta", False):
        # checksummed delta buckets (sglang_patches.weight_payload); dense buckets use the model's own loader
        from sglang_patches.weight_payload import LOADER

        args += ["--custom-weight-loader", LOADER]
    if enable_memory_saver and "--enable-memory-saver" not in extra:
        args.append("--enable-memory-saver")
    if validate:
        validate_server_args(args + extra)
    flag_field = _sglang_cli()[2] if validate else {}
    ours = {flag_field.get(a, a) for a in args if a.startswith("--")}
    clash = sorted(a.split("=", 1)[0] for a in extra
                   if a.startswith("--") and flag_field.get(a.split("=", 1)[0], a.split("=", 1)[0]) in ours)
    if clash:
        raise ServerArgsError(f"extra_server_args repeat settings the launcher makes from the config: {clash}")
    args += extra
    return [python or sys.executable, "-m", "sglang.launch_server", *args]


def _http_ok(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class SGLangServer:
    """One server subprocess in its own process group. Use as a context manager, or start()/stop()."""

    def __init__(self, command: Sequence[str], host: str = "127.0.0.1", port: int = 30000, *,
                 startup_timeout_s: float = 1800.0, poll_interval_s: float = 2.0, log_every_s: float = 30.0,
                 env: Optional[dict[str, str]] = None, log_path: Optional[str] = None,
                 preexec_fn: Optional[Any] = None):
        self.command = list(command)
        self.host, self.port = host, int(port)
        self.startup_timeout_s = float(startup_timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        self.log_every_s = float(log_every_s)
        self.env = {**os.environ, **DEFAULT_ENV, **(env or {})}
        # the server unpickles our CustomLogitProcessor by reference: it must import this repo
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), self.env.get("PYTHONPATH", "")) if p)
        self.log_path = log_path
        self.preexec_fn = preexec_fn  # run in the child before exec (e.g. die with the parent)
        self.proc: Optional[subprocess.Popen] = None
        self._log_file: Any = None

    @classmethod
    def from_config(cls, cfg_sglang: Any, model_path: Optional[str], port: int, host: str = "127.0.0.1",
                    **kwargs: Any) -> "SGLangServer":
        cmd_kwargs = {k: kwargs.pop(k) for k in ("enable_memory_saver", "validate", "python") if k in kwargs}
        return cls(build_server_command(cfg_sglang, model_path, port, host, **cmd_kwargs), host, port, **kwargs)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "SGLangServer":
        if self.proc is not None:
            raise RuntimeError("server already started")
        out: Any = None
        if self.log_path:
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log_file
        logger.info("starting SGLang server: %s", " ".join(self.command))
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                     start_new_session=True, preexec_fn=self.preexec_fn)
        return self

    def wait_healthy(self, timeout_s: Optional[float] = None) -> None:
        assert self.proc is not None, "start() first"
        timeout = self.startup_timeout_s if timeout_s is None else timeout_s
        start = last_log = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"SGLang server exited with code {code} before it was healthy"
                                   + (f" (log: {self.log_path})" if self.log_path else ""))
            if _http_ok(f"{self.base_url}/health", timeout=min(5.0, self.poll_interval_s + 1)):
                logger.info("SGLang server %s healthy after %.0fs", self.base_url, time.monotonic() - start)
                return
            now = time.monotonic()
            if now - start > timeout:
                self.stop()
                raise TimeoutError(f"SGLang server {self.base_url} not healthy after {timeout:.0f}s")
            if now - last_log >= self.log_every_s:
                logger.info("waiting for SGLang server %s (%.0fs / %.0fs)", self.base_url, now - start, timeout)
                last_log = now
            time.sleep(self.poll_interval_s)

    def stop(self, grace_s: float = 30.0) -> Optional[int]:
        """SIGTERM the process group, then SIGKILL it after `grace_s`. Returns the exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    os.killpg(proc.pid, signal.SIGCONT)  # a stopped (hung) server would never see the SIGTERM
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    logger.warning("SGLang server %s ignored SIGTERM; killing its process group", self.base_url)
            try:  # children (scheduler, detokenizer) may outlive the launcher
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return proc.wait(timeout=grace_s)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def __enter__(self) -> "SGLangServer":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["build_server_command", "validate_server_args", "server_arg_fields", "SGLangServer", "ServerArgsError"]
