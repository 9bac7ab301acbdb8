"""The scoring servers' pool (`slime_ext.engine.scoring_pool`): prefill-only requests spread over the servers in
chunks, the answers in the order asked, equal to the embedded engine scoring the same ids."""

from __future__ import annotations

import pickle

import pytest

from slime_ext.engine import scoring_pool
from slime_ext.engine.scoring_pool import ScoringPool


class _Client:
    """Records each request; the 'logprob' of token t at position p is -(t + p / 1000)."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def score(self, sequences, starts):
        self.log.append((self.name, len(sequences)))
        return [[-(t + p / 1000) for p, t in enumerate(seq) if p >= start] for seq, start in zip(sequences, starts)]


def test_requests_are_chunked_spread_over_the_servers_and_answered_in_order(monkeypatch):
    monkeypatch.setattr(scoring_pool, "SCORE_REQUEST_SEQUENCES", 3)
    log: list = []
    pool = ScoringPool(["http://a", "http://b"])
    pool._clients = [_Client("a", log), _Client("b", log)]
    sequences = [[i, i + 1, i + 2, i + 3][: 2 + i % 3] for i in range(8)]
    starts = [1 + i % 2 for i in range(8)]
    out = pool.score(sequences, starts)
    assert out == [[-(t + p / 1000) for p, t in enumerate(s) if p >= st] for s, st in zip(sequences, starts)]
    assert sorted(log) == [("a", 2), ("a", 3), ("b", 3)]  # chunks of 3, 3, 2 to a, b, a
    assert pool.score([], []) == []
    with pytest.raises(ValueError, match="2 sequences but 1 starts"):
        pool.score([[1, 2], [3, 4]], [1])


def test_the_pool_pickles_without_its_clients():
    pool = ScoringPool(["http://a"])
    pool._clients = [object()]
    copy = pickle.loads(pickle.dumps(pool))
    assert copy._clients is None and copy.urls == ["http://a"]
    with pytest.raises(ValueError, match="at least one server"):
        ScoringPool([])
