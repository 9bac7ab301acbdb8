"""Escapes from the code sandbox (issue 15, item 5): each one must fail, and the suite must stay fast.

Tests that need real isolation skip with a reason when bubblewrap is missing or cannot run here.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from slime_ext.rewards import code_sandbox, verify_code
from slime_ext.rewards.code_checks import plan_tests
from slime_ext.rewards.code_sandbox import MAX_PROCESSES, bwrap_available

needs_bwrap = pytest.mark.skipif(bwrap_available() is None, reason="bubblewrap (bwrap) is not installed or cannot run here")
needs_root_bwrap = pytest.mark.skipif(
    bwrap_available() is None or os.geteuid() != 0,
    reason="RLIMIT_NPROC needs bwrap and a root verifier (it switches the candidate to a fresh uid)",
)
pytestmark = pytest.mark.timeout(30)


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def _processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


# ---------------------------------------------------------------- the escapes from the issue


@needs_bwrap
def test_cannot_write_outside_its_directory(tmp_path: Path) -> None:
    targets = [tmp_path / "escaped.txt", Path("/tmp") / f"slime_escape_{uuid.uuid4().hex}"]
    program = "import os\nWROTE = []\n"
    for target in targets:
        program += f"try:\n    open({str(target)!r}, 'w').write('x')\n    WROTE.append(1)\nexcept OSError:\n    pass\n"
    program += "open('inside.txt', 'w').write('ok')\nOWN = open('inside.txt').read()\n"
    result = verify_code(fenced(program), ["assert OWN == 'ok'"])
    assert result.reason == "correct", result.detail  # its own directory is writable
    assert not any(t.exists() for t in targets)


@needs_bwrap
def test_cannot_read_etc_passwd() -> None:
    program = (
        "DATA = []\n"
        "for path in ['/etc/passwd', '/proc/1/root/etc/passwd', '/root/.bashrc']:\n"
        "    try:\n"
        "        DATA.append(open(path).read())\n"
        "    except OSError:\n"
        "        pass\n"
    )
    result = verify_code(fenced(program), ["assert DATA == []"])
    assert result.reason == "correct", result.detail


@needs_bwrap
def test_cannot_signal_the_verifier_or_other_processes() -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        program = (
            "import os, signal\n"
            "SENT = 0\n"
            f"for pid, sig in [(os.getppid(), signal.SIGUSR1), ({os.getpid()}, signal.SIGUSR1),"
            f" ({bystander.pid}, signal.SIGKILL), (1, signal.SIGKILL)]:\n"
            "    try:\n"
            "        os.kill(pid, sig)\n"
            "        SENT += 1\n"
            "    except OSError:\n"
            "        pass\n"
        )
        result = verify_code(fenced(program), ["assert SENT >= 0"])
        time.sleep(0.2)
        assert received == []
        assert bystander.poll() is None, "the sandbox killed a process outside it"
        assert result.reason == "correct", result.detail
    finally:
        signal.signal(signal.SIGUSR1, previous)
        bystander.kill()
        bystander.wait()


@needs_bwrap
def test_no_process_survives_the_verdict() -> None:
    marker = f"slime-sandbox-survivor-{uuid.uuid4().hex}"
    program = (
        "import os, subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}], start_new_session=True)\n"
        "if os.fork() == 0:\n"  # a classic double-forked daemon
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
        "    os._exit(0)\n"
        "DONE = True\n"
    )
    result = verify_code(fenced(program), ["assert DONE"])
    assert result.reason == "correct", result.detail
    deadline = time.monotonic() + 5
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = _processes_with(marker)
    for proc in survivors:
        proc.kill()
    assert survivors == []


def test_always_equal_object_does_not_pass() -> None:
    program = (
        "class AlwaysEqual:\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = object.__hash__\n"
        "class EqualInt(int):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "def add(a, b):\n"
        "    return AlwaysEqual()\n"
        "def mul(a, b):\n"
        "    return EqualInt(0)\n"
    )
    for test in ("assert add(1, 2) == 3", "assert mul(2, 3) == 6", "assert 3 == add(1, 2)", "assert [add(1, 2)] == [3]"):
        result = verify_code(fenced(program), [test])
        assert (result.score, result.reason) == (0.0, "tests_failed"), (test, result)
        assert result.detail is not None and "not plain data" in result.detail


def test_frame_introspection_does_not_find_the_expected_value() -> None:
    # The test's expectation is wrong on purpose (2 + 2 == 918273645): only a program that reads the
    # expected value out of the harness (frames, code constants, locals, globals, the gc heap) passes.
    program = (
        "import gc, sys\n"
        "def reachable_ints():\n"
        "    seen = []\n"
        "    frame = sys._getframe(2)\n"
        "    while frame is not None:\n"
        "        seen += [c for c in frame.f_code.co_consts if type(c) is int]\n"
        "        seen += [v for v in list(frame.f_locals.values()) + list(frame.f_globals.values()) if type(v) is int]\n"
        "        frame = frame.f_back\n"
        "    for obj in gc.get_objects():\n"
        "        if type(obj) in (list, tuple, dict):\n"
        "            seen += [v for v in (obj.values() if type(obj) is dict else obj) if type(v) is int]\n"
        "    return seen\n"
        "def add(a, b):\n"
        "    guesses = [v for v in reachable_ints() if 10**8 < v < 10**10]\n"
        "    return max(guesses) if guesses else a + b\n"
        "def expected_is_reachable():\n"
        "    return int('9182736' + '45') in reachable_ints()  # built at run time, not a constant\n"
    )
    result = verify_code(fenced(program), ["assert add(2, 2) == 918273645"])
    assert (result.score, result.reason) == (0.0, "tests_failed"), result
    probe = verify_code(fenced(program), ["assert expected_is_reachable() == False", "assert 918273645 > 0"])
    assert probe.reason == "correct", probe.detail


def test_expected_values_are_not_sent_to_the_candidate() -> None:
    plan = plan_tests(["assert add(1, 2) == 314159", "assert abs(area(2.0) - 12.566) < 1e-3, 'area'",
                       "assert sorted(roots()) == [271828, 3]"])
    sent = repr(plan.steps)
    assert "314159" not in sent and "12.566" not in sent and "271828" not in sent
    assert [s["eval"] for s in plan.steps] == [["add(1, 2)"], ["area(2.0)"], ["roots()"]]


@needs_bwrap
def test_network_namespace_is_empty() -> None:
    program = (
        "import _socket\n"
        "s = _socket.socket()\n"
        "try:\n"
        "    s.connect(('1.1.1.1', 53))\n"
        "    OUTCOME = 'connected'\n"
        "except OSError as exc:\n"
        "    OUTCOME = 'OSError'\n"
        "import os\n"
        "IFACES = sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else []\n"
    )
    result = verify_code(fenced(program), ["assert OUTCOME == 'OSError'", "assert IFACES in ([], ['lo'])"])
    assert result.reason == "correct", result.detail


@needs_root_bwrap
def test_process_count_is_limited() -> None:
    program = (
        "import os, time\n"
        "STARTED = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(10)\n"
        "        os._exit(0)\n"
        "    STARTED += 1\n"
    )
    result = verify_code(fenced(program), [f"assert STARTED < {MAX_PROCESSES}"])
    assert result.reason == "correct", result.detail


@needs_root_bwrap
def test_fork_bomb_ends_fast_and_leaves_nothing() -> None:
    start = time.monotonic()
    result = verify_code(fenced("import os\nwhile True:\n    os.fork()"), ["assert True"], time_limit_s=2.0)
    assert result.score == 0.0
    assert time.monotonic() - start < 10


def test_large_result_value_does_not_pass() -> None:
    result = verify_code(fenced("def big():\n    return 'x' * (8 << 20)"), ["assert big() == 'x'"])
    assert result.score == 0.0


def test_nested_asserts_are_refused() -> None:
    tests = "def check(f):\n    assert f(1) == 2\ncheck(inc)"
    result = verify_code(fenced("def inc(x):\n    return x + 1"), tests)
    assert result.reason == "bad_label" and result.detail is not None and "top-level" in result.detail


@pytest.mark.parametrize(
    ("tests", "reason"),
    [
        (["import math", "assert math.isclose(area(1.0), 3.14159, rel_tol=1e-4)"], "correct"),
        (["assert abs(area(1.0) - 3.14159) < 1e-4"], "correct"),
        (["r = 2.0", "assert area(r) > 12 and area(r) < 13"], "correct"),
        (["assert area(1.0) != area(2.0)", "assert not area(0.0)"], "correct"),
        (["assert area(1.0) == 3"], "tests_failed"),
        (["assert len(shape()) == 2", "assert shape() == (1, 'a')", "assert shape() != [1, 'a']"], "correct"),
        (["assert shape()[2] == 0"], "runtime_error"),
        (["assert 1 < area(1.0) < 3"], "tests_failed"),
    ],
)
def test_assert_forms(tests: list[str], reason: str) -> None:
    program = "import math\ndef area(r):\n    return math.pi * r * r\ndef shape():\n    return (1, 'a')\n"
    result = verify_code(fenced(program), tests)
    assert result.reason == reason, result.detail


# ---------------------------------------------------------------- fallback


def test_fallback_without_bwrap_warns_once_and_still_judges(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_which = code_sandbox.shutil.which
    monkeypatch.setattr(code_sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    code_sandbox.bwrap_available.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=code_sandbox.__name__):
            ok = verify_code(fenced("def add(a, b):\n    return a + b"), ["assert add(1, 2) == 3"])
            bad = verify_code(fenced("def add(a, b):\n    return a - b"), ["assert add(1, 2) == 3"])
        assert (ok.reason, bad.reason) == ("correct", "tests_failed")
        warnings = [r for r in caplog.records if "bwrap" in r.getMessage()]
        assert len(warnings) == 1 and "fallback" in warnings[0].getMessage()
    finally:
        code_sandbox.bwrap_available.cache_clear()
