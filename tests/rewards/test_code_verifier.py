"""Code verifier: block extraction and the sandboxed test run (limits, network, verdicts)."""

from __future__ import annotations

import socket

import pytest

from slime_ext.rewards import extract_code_block, get_verifier, verify_code
from slime_ext.rewards.code_sandbox import bwrap_available, unshare_prefix


def fenced(code: str, lang: str = "python") -> str:
    return f"Here is my solution:\n```{lang}\n{code}\n```\nDone."


ADD_OK = "def add(a, b):\n    return a + b"
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```python\nprint(1)\n```", "print(1)\n"),
        ("```py\nx = 1\n```", "x = 1\n"),
        ("```\nx = 2\n```", "x = 2\n"),
        ("draft:\n```python\nx = 1\n```\nfinal:\n```python\nx = 2\n```", "x = 2\n"),
        ("inline ```x = 3``` block", "x = 3\n"),
        ("````python\nx = 4\n````", "x = 4\n"),
        ("```python\nx = 1\n```\nthen\n```python\nx = 2", None),  # last block unterminated
        ("```python\nprint(1)", None),
        ("no code at all", None),
        ("```python\n```", ""),
        (None, None),
    ],
)
def test_extract_code_block(text: str, expected: str | None) -> None:
    assert extract_code_block(text) == expected


# ---------------------------------------------------------------- verdicts


@pytest.mark.timeout(30)
def test_correct_program_passes() -> None:
    result = verify_code(fenced(ADD_OK), ADD_TESTS)
    assert (result.score, result.reason) == (1.0, "correct")
    assert result.extracted is not None and "def add" in result.extracted


@pytest.mark.timeout(30)
def test_tests_as_one_string() -> None:
    assert verify_code(fenced(ADD_OK), "\n".join(ADD_TESTS)).score == 1.0


@pytest.mark.timeout(30)
def test_wrong_answer_reports_failed_assertion() -> None:
    tests = ["assert add(0, 0) == 0", "assert add(1, 2) == 3, 'one plus two'"]
    result = verify_code(fenced("def add(a, b):\n    return a - b"), tests)
    assert (result.score, result.reason) == (0.0, "tests_failed")
    assert result.detail is not None
    assert "assert add(1, 2) == 3" in result.detail and "one plus two" in result.detail


@pytest.mark.timeout(30)
def test_infinite_loop_hits_time_limit() -> None:
    result = verify_code(fenced("while True:\n    pass"), ["assert True"], time_limit_s=1.0)
    assert (result.score, result.reason) == (0.0, "time_limit")


@pytest.mark.timeout(30)
def test_sleeping_program_hits_wall_clock_limit() -> None:
    result = verify_code(fenced("import time\ntime.sleep(60)"), ["assert True"], time_limit_s=1.0)
    assert result.reason == "time_limit"


@pytest.mark.timeout(30)
def test_allocating_4gb_hits_memory_limit() -> None:
    result = verify_code(fenced("buf = bytearray(4 * 1024 ** 3)"), ["assert len(buf) > 0"], memory_limit_mb=512)
    assert (result.score, result.reason) == (0.0, "memory_limit")


@pytest.mark.timeout(30)
def test_network_is_disabled_inside_the_program() -> None:
    program = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
        "    OUTCOME = 'connected'\n"
        "except OSError as exc:\n"
        "    OUTCOME = 'OSError: ' + str(exc)\n"
    )
    result = verify_code(fenced(program), ["assert OUTCOME.startswith('OSError'), OUTCOME"])
    assert (result.score, result.reason) == (1.0, "correct")
    # and the check in the program really can fail:
    connected = verify_code(fenced("OUTCOME = 'connected'"), ["assert OUTCOME.startswith('OSError'), OUTCOME"])
    assert connected.reason == "tests_failed"


@pytest.mark.timeout(30)
def test_raw_socket_cannot_reach_host_listener() -> None:
    """Bypassing the Python-level patch (``_socket``) still fails under bwrap or ``unshare --net``."""
    if not (bwrap_available() or unshare_prefix()):
        pytest.skip("neither bwrap nor unshare --net is available on this machine")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        program = (
            "import _socket\n"
            "s = _socket.socket()\n"
            "try:\n"
            f"    s.connect(('127.0.0.1', {port}))\n"
            "    OUTCOME = 'connected'\n"
            "except OSError as exc:\n"
            "    OUTCOME = 'OSError: ' + str(exc)\n"
        )
        result = verify_code(fenced(program), ["assert OUTCOME.startswith('OSError'), OUTCOME"])
    assert (result.score, result.reason) == (1.0, "correct"), result.detail


def test_no_code_block() -> None:
    assert verify_code("I would write a loop.", ADD_TESTS).reason == "no_code_block"
    assert verify_code("```python\ndef add(a, b):", ADD_TESTS).reason == "no_code_block"


@pytest.mark.timeout(30)
def test_syntax_error_is_runtime_error() -> None:
    result = verify_code(fenced("def add(a, b)\n    return a + b"), ADD_TESTS)
    assert (result.score, result.reason) == (0.0, "runtime_error")
    assert result.detail is not None and "SyntaxError" in result.detail


@pytest.mark.timeout(30)
def test_exception_in_program_is_runtime_error() -> None:
    assert verify_code(fenced("raise ValueError('boom')"), ["assert True"]).reason == "runtime_error"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("escape", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "exit()"])
def test_exiting_before_the_tests_does_not_pass(escape: str) -> None:
    result = verify_code(fenced(escape), ["assert False, 'tests must run'"])
    assert (result.score, result.reason) == (0.0, "runtime_error")


@pytest.mark.timeout(30)
def test_forged_status_without_nonce_does_not_pass() -> None:
    program = (
        "import json, os, sys\n"
        "os.write(int(sys.argv[1]), json.dumps({'nonce': 'guess', 'status': 'ok'}).encode())\n"
        "os._exit(0)\n"
    )
    assert verify_code(fenced(program), ["assert False"]).reason == "runtime_error"


@pytest.mark.timeout(30)
def test_environment_and_cwd_are_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLIME_TEST_SECRET", "hunter2")
    program = "import os\nENV = dict(os.environ)\nFILES = os.listdir('.')\n"
    tests = [
        "assert 'SLIME_TEST_SECRET' not in ENV, ENV",
        "assert FILES == [], FILES",
        "assert ENV['PATH'] == '/usr/local/bin:/usr/bin:/bin'",
    ]
    assert verify_code(fenced(program), tests).reason == "correct"


@pytest.mark.timeout(30)
def test_flood_of_output_is_cut_and_does_not_pass() -> None:
    result = verify_code(fenced("while True:\n    print('x' * 10000)"), ["assert True"], time_limit_s=2.0)
    assert result.score == 0.0
    assert result.reason in {"runtime_error", "time_limit"}  # file-size limit usually stops it first
    assert result.detail is not None and len(result.detail) < 4000


@pytest.mark.timeout(30)
def test_stdin_is_empty_not_blocking() -> None:
    program = "try:\n    LINE = input()\nexcept EOFError:\n    LINE = None\n"
    assert verify_code(fenced(program), ["assert LINE is None"], time_limit_s=2.0).reason == "correct"


def test_empty_tests_are_a_bad_label() -> None:
    assert verify_code(fenced(ADD_OK), []).reason == "bad_label"
    assert verify_code(fenced(ADD_OK), "  ").reason == "bad_label"


@pytest.mark.timeout(30)
def test_registry_code_verifier() -> None:
    assert get_verifier("code")(fenced(ADD_OK), ADD_TESTS).score == 1.0
