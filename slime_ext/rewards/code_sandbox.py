"""Run the candidate harness under real isolation and collect what it reports, never a verdict.

Isolation (bubblewrap, ``bwrap``, when it is installed and works here):
* namespaces: new PID, network, IPC, UTS (and cgroup) namespaces; the candidate cannot see or signal
  any process outside, and has only a loopback-less network;
* filesystem: an empty root with read-only binds of ``/usr`` (plus the ``/lib*``/``/bin`` links) and
  the interpreter's prefix, a fresh ``/proc`` and ``/dev``, a tmpfs ``/tmp`` and one private writable
  directory (``/sandbox``, the cwd). ``/etc``, ``/home``, ``/root``, the repository are absent;
* process lifetime: ``--new-session`` (no terminal), ``--die-with-parent``, and because the PID
  namespace dies with its init, every process the candidate started -- ``setsid`` or not -- is killed
  when the candidate exits or the verifier kills the sandbox;
* limits (rlimits, inherited by every process): address space, CPU seconds, file size (which also caps
  stdout/stderr and the results file, all written to files outside the sandbox), no core dumps;
  when the verifier runs as root the harness switches to a fresh unprivileged uid before any
  candidate code runs, so ``RLIMIT_NPROC`` bounds the number of processes (a fork bomb fails fast);
* a wall-clock deadline, after which the whole process group is killed.

Fallback when bwrap is missing or cannot create namespaces: a plain ``python -I -S`` subprocess in a
new session with the same rlimits, a fresh cwd and a minimal environment, plus an empty network
namespace via ``unshare --net`` where that works and a Python-level socket block. That is a guard
against accidents, not against a hostile program (it can read world-readable files and signal
processes of the same user). A warning naming the missing tool is logged once.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

OUTPUT_TAIL_BYTES = 4096
MAX_FILE_BYTES = 4 << 20
MAX_PROCESSES = 32
STARTUP_GRACE_S = 1.0
"""Added to the wall-clock limit for interpreter start, which is slow on a loaded machine."""
SANDBOX_DIR = "/sandbox"
_UID_RANGE = (1 << 20, 1 << 30)
"""Fresh uids are drawn from here: unused by real accounts, so RLIMIT_NPROC counts only this run."""

_HARNESS_SOURCE = (Path(__file__).with_name("candidate_harness.py")).read_text(encoding="utf-8")


@dataclass
class RawOutcome:
    """What came back from one sandbox run. ``records``: the harness's JSON lines, parsed."""

    records: list[dict[str, Any]] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    timed_out: bool = False
    isolation: str = "bwrap"


def _interpreter() -> tuple[str, str]:
    """(real interpreter path, its prefix): the base interpreter, not a virtualenv's wrapper."""
    exe = os.path.realpath(sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


def _bwrap_command(bwrap: str, workdir: str, as_root: bool) -> list[str]:
    exe, prefix = _interpreter()
    cmd = [bwrap]
    if as_root:
        # Root: no user namespace, so the harness can switch to a fresh uid (and RLIMIT_NPROC applies).
        cmd += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-all"]
    cmd += ["--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / link
        if path.is_symlink():
            cmd += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            cmd += ["--ro-bind", str(path), str(path)]
    if not prefix.startswith("/usr/"):
        # Parents that bwrap would create are root-only (0700); the candidate's uid must traverse them.
        for parent in reversed(Path(prefix).parents[:-1]):
            cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", prefix, prefix]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", workdir, SANDBOX_DIR,
            "--chdir", SANDBOX_DIR, "--clearenv"]
    for key, value in _minimal_env(SANDBOX_DIR).items():
        cmd += ["--setenv", key, value]
    return cmd + ["--", exe, "-I", "-S"]


@functools.lru_cache(maxsize=1)
def bwrap_available() -> str | None:
    """Path of a bwrap that can build our sandbox here, or None (then a one-time warning is logged)."""
    exe = shutil.which("bwrap")
    if exe is None:
        log.warning("bubblewrap (bwrap) is not installed: code runs in the weaker fallback sandbox "
                    "(rlimits + new session, no filesystem or PID isolation); install the 'bubblewrap' package")
        return None
    with tempfile.TemporaryDirectory(prefix="slime_bwrap_probe_") as tmp:
        cmd = _bwrap_command(exe, tmp, os.geteuid() == 0) + ["-c", "pass"]
        try:
            probe = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            probe = None
            why = str(exc)
        else:
            why = probe.stderr.decode("utf-8", "replace").strip()[:300]
    if probe is None or probe.returncode != 0:
        log.warning("bubblewrap (%s) cannot create a sandbox here (%s): code runs in the weaker fallback "
                    "sandbox (rlimits + new session, no filesystem or PID isolation)", exe, why)
        return None
    return exe


@functools.lru_cache(maxsize=1)
def unshare_prefix() -> tuple[str, ...]:
    """``("/usr/bin/unshare", "--net")`` if an empty network namespace can be made here, else ()."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        probe = subprocess.run(
            [exe, "--net", sys.executable, "-I", "-S", "-c", "pass"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    return (exe, "--net") if probe.returncode == 0 else ()


def _limits_preexec(time_limit_s: float, memory_limit_mb: int) -> Callable[[], None]:
    """preexec_fn setting the rlimits. Values are computed here so the child only calls setrlimit."""
    cpu = math.ceil(time_limit_s) + 1
    wanted = [
        (resource.RLIMIT_AS, (memory_limit_mb << 20,) * 2),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # soft: SIGXCPU, hard: SIGKILL
        (resource.RLIMIT_FSIZE, (MAX_FILE_BYTES,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    limits = []
    for res, (soft, hard) in wanted:
        _, current_hard = resource.getrlimit(res)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        limits.append((res, (soft, hard)))
    setrlimit = resource.setrlimit

    def preexec() -> None:
        for res, pair in limits:
            setrlimit(res, pair)

    return preexec


def _minimal_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _tail(path: Path, limit: int = OUTPUT_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return ""
    prefix = "...[truncated]\n" if size > limit else ""
    return prefix + data.decode("utf-8", "replace")


def _read_records(path: Path) -> list[dict[str, Any]]:
    """The harness's JSON lines; malformed lines (the candidate may write here too) are skipped."""
    records = []
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return records
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_candidate(
    solution: str,
    steps: list[dict[str, Any]],
    time_limit_s: float = 5.0,
    memory_limit_mb: int = 512,
) -> RawOutcome:
    """Runs the harness on ``solution`` and ``steps`` (see candidate_harness) in the best sandbox here."""
    bwrap = bwrap_available()
    as_root = os.geteuid() == 0
    uid = secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0] if (bwrap and as_root) else None
    plan = {"solution": solution, "steps": steps, "uid": uid, "nproc": MAX_PROCESSES,
            "block_network": bwrap is None}
    with tempfile.TemporaryDirectory(prefix="slime_code_", ignore_cleanup_errors=True) as tmp_name:
        tmp = Path(tmp_name)
        workdir = tmp / "work"
        workdir.mkdir()
        if uid is not None:
            os.chown(workdir, uid, uid)
        plan_path, results_path = tmp / "plan.json", tmp / "results.jsonl"
        plan_path.write_text(json.dumps(plan), encoding="utf-8", errors="replace")
        stdout_path, stderr_path = tmp / "stdout.txt", tmp / "stderr.txt"
        results_fd = os.open(results_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        if bwrap:
            cmd = _bwrap_command(bwrap, str(workdir), as_root)
            env = None
            cwd = None
        else:
            cmd = [*unshare_prefix(), sys.executable, "-I", "-S"]
            env, cwd = _minimal_env(str(workdir)), workdir
        cmd += ["-c", _HARNESS_SOURCE, str(results_fd)]
        try:
            with open(plan_path, "rb") as plan_in, open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
                proc = subprocess.Popen(
                    cmd, stdin=plan_in, stdout=out, stderr=err, cwd=cwd, env=env if env is not None else {},
                    pass_fds=(results_fd,), start_new_session=True,
                    preexec_fn=_limits_preexec(time_limit_s, memory_limit_mb),
                )
        finally:
            os.close(results_fd)
        timed_out = False
        try:
            proc.wait(timeout=time_limit_s + STARTUP_GRACE_S)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)  # bwrap and, through its PID namespace, everything inside
            proc.wait()
        return RawOutcome(_read_records(results_path), _tail(stdout_path), _tail(stderr_path), proc.returncode,
                          timed_out, "bwrap" if bwrap else "fallback")
