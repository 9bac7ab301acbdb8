"""The project's retry rule (`slime_ext.clients.retry`): what is retried, the backoff schedule, the attempt
loop and `call_with_retries`; the clients' own retry tests are in test_openai_client.py and
tests/engine/test_sglang_client.py."""

from __future__ import annotations

import socket
import urllib.error

import pytest

from slime_ext.clients import retry


@pytest.fixture
def sleeps(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", slept.append)
    return slept


@pytest.mark.parametrize("exc, status, expected", [
    (RuntimeError("HTTP 503"), 503, True), (RuntimeError("HTTP 500"), 500, True), (RuntimeError("HTTP 429"), 429, True),
    (RuntimeError("HTTP 400"), 400, False), (RuntimeError("HTTP 404"), 404, False),
    (ConnectionRefusedError(), None, True), (TimeoutError(), None, True), (socket.timeout(), None, True),
    (urllib.error.URLError("down"), None, True), (OSError("reset"), None, True),
    (ValueError("bad json"), None, False), (KeyError("choices"), None, False),
])
def test_what_is_retried(exc, status, expected):
    assert retry.is_retryable(exc, status) is expected


def test_backoff_doubles_up_to_the_cap(sleeps):
    assert [retry.backoff_delay(k, 0.5, 3.0) for k in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    calls: list[int] = []
    seen = list(retry.attempts(4, 0.5, 3.0, on_retry=lambda: calls.append(len(sleeps))))
    assert seen == [0, 1, 2, 3, 4] and sleeps == [0.5, 1.0, 2.0, 3.0]
    assert calls == [0, 1, 2, 3]  # on_retry runs before each retry's sleep, never before the first attempt
    assert list(retry.attempts(0, 0.5, 3.0)) == [0]


def test_call_with_retries_returns_raises_and_counts(sleeps):
    errors = [ConnectionResetError("1"), TimeoutError("2")]

    def flaky():
        if errors:
            raise errors.pop(0)
        return "ok"

    retries: list[int] = []
    assert retry.call_with_retries(flaky, 3, 0.1, 1.0, retry.is_retryable, lambda: retries.append(1)) == "ok"
    assert len(retries) == 2 and sleeps == [0.1, 0.2]

    def final():
        raise ValueError("final")

    sleeps.clear()
    with pytest.raises(ValueError, match="final"):  # not retryable: raised at once
        retry.call_with_retries(final, 3, 0.1, 1.0, retry.is_retryable)
    assert sleeps == []

    def dead():
        raise ConnectionRefusedError(f"attempt {len(sleeps)}")

    with pytest.raises(ConnectionRefusedError, match="attempt 2"):  # the last error once the retries are spent
        retry.call_with_retries(dead, 2, 0.1, 1.0, retry.is_retryable)
    assert sleeps == [0.1, 0.2]
