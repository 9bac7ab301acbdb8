"""A small token-id prefix cache of per-layer key/value tensors (the embedded engine's radix cache).

Entries map a token-id sequence to the KV of exactly those tokens. A lookup returns the longest common
prefix of the query with any stored sequence (with causal attention the KV of a sequence's first n
tokens is the KV of those n tokens alone), so a continuation (prompt + partial response + appended
text) reuses the KV of its prompt and response. Bounded by a token budget with least-recently-used eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each [heads, length, dim]


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...], limit: int) -> int:
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    def __init__(self, max_tokens: int = 1 << 20):
        self.max_tokens = max_tokens
        self._entries: "OrderedDict[tuple[int, ...], KV]" = OrderedDict()
        self._routing: dict[tuple[int, ...], torch.Tensor] = {}  # key -> [len(key), moe_layers, top_k]
        self._tokens = 0
        self.hits = 0
        self.lookups = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def insert(self, ids: Sequence[int], kv: KV, routing: Optional[torch.Tensor] = None) -> None:
        key = tuple(int(i) for i in ids)
        if routing is not None and routing.shape[0] != len(key):
            raise ValueError(f"routing length {routing.shape[0]} does not match {len(key)} token ids")
        if not key or key in self._entries:
            if key in self._entries:
                self._entries.move_to_end(key)
                if routing is not None and key not in self._routing:
                    self._routing[key] = routing
            return
        if any(k.shape[1] != len(key) for k, _ in kv):
            raise ValueError(f"KV length {kv[0][0].shape[1]} does not match {len(key)} token ids")
        self._entries[key] = kv
        if routing is not None:
            self._routing[key] = routing
        self._tokens += len(key)
        while self._tokens > self.max_tokens and len(self._entries) > 1:
            old, _ = self._entries.popitem(last=False)
            self._routing.pop(old, None)
            self._tokens -= len(old)

    def _match(self, ids: Sequence[int], max_len: Optional[int], with_routing: bool) -> tuple[int, Optional[tuple[int, ...]]]:
        self.lookups += 1
        query = tuple(int(i) for i in ids)
        limit = len(query) if max_len is None else min(max_len, len(query))
        best_key, best_len = None, 0
        for key in self._entries:
            if with_routing and key not in self._routing:
                continue
            n = _common_prefix(key, query, limit)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best_len
        return best_len, best_key

    def longest_prefix(self, ids: Sequence[int], max_len: Optional[int] = None) -> tuple[int, Optional[KV]]:
        """(length, KV truncated to it) of the longest cached prefix of `ids`, at most `max_len` long."""
        n, key = self._match(ids, max_len, with_routing=False)
        if key is None:
            return 0, None
        return n, [(k[:, :n], v[:, :n]) for k, v in self._entries[key]]

    def longest_prefix_routed(self, ids: Sequence[int], max_len: Optional[int] = None
                              ) -> tuple[int, Optional[KV], Optional[torch.Tensor]]:
        """(length, KV, routing [length, moe_layers, top_k]) of the longest cached prefix among the entries
        that carry routing (a request that records routed experts must not reuse a prefix whose routing is
        unknown: that prefix is recomputed)."""
        n, key = self._match(ids, max_len, with_routing=True)
        if key is None:
            return 0, None, None
        return n, [(k[:, :n], v[:, :n]) for k, v in self._entries[key]], self._routing[key][:n]

    def prefix_length(self, ids: Sequence[int], max_len: Optional[int] = None, with_routing: bool = False) -> int:
        """Length of the longest cached prefix (no statistics, no reordering)."""
        query = tuple(int(i) for i in ids)
        limit = len(query) if max_len is None else min(max_len, len(query))
        return max((_common_prefix(key, query, limit) for key in self._entries
                    if not with_routing or key in self._routing), default=0)

    def clear(self) -> None:
        self._entries.clear()
        self._routing.clear()
        self._tokens = 0
