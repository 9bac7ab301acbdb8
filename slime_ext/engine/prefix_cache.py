"""A small token-id prefix cache of per-layer key/value tensors (the embedded engine's radix cache).

Entries map a token-id sequence to the KV of exactly those tokens. A lookup returns the longest common
prefix of the query with any stored sequence (with causal attention the KV of a sequence's first n
tokens is the KV of those n tokens alone), so a continuation (prompt + partial response + appended
text) reuses the KV of its prompt and response. Bounded by a token budget with least-recently-used eviction.

Storage is shared between entries: an entry is a list of segments, each the first tokens of a stored block.
When an inserted sequence shares a prefix with a cached one (a sample's prompt + response extends the
prompt inserted at prefill), the new entry references that entry's blocks for the shared part and stores
only its own tail, so n samples of a prompt hold the prompt's KV once, not n + 1 times. Blocks are
reference-counted: the budget counts the tokens of the blocks held (each once), and evicting an entry frees
a block only when no remaining entry uses it.

Keys are indexed in a token trie (pygtrie), so a lookup or insertion walks the query's tokens once instead of
comparing it with every entry: with thousands of entries (a handoff evaluation's turns, an evaluation's samples)
the scan made each generate call quadratic in the entries cached. Of several entries sharing the longest prefix,
a lookup takes (and refreshes) the lexicographically smallest key, the first the sorted trie reaches.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

import pygtrie
import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each [heads, length, dim]
TailKV = Callable[[int], KV]  # start -> KV of the sequence's tokens from `start` on, in storage it owns


class _KeyIndex:
    """Token-id keys in a trie: the longest common prefix of a query with any key, and the smallest key that
    shares it, in time proportional to the query's length."""

    def __init__(self) -> None:
        self._trie: pygtrie.Trie = pygtrie.Trie()
        self._trie.enable_sorting(True)  # iteration in key order: the first key under a node is the smallest

    def add(self, key: tuple[int, ...]) -> None:
        self._trie[key] = True

    def discard(self, key: tuple[int, ...]) -> None:
        self._trie.pop(key, None)

    def clear(self) -> None:
        self._trie.clear()

    def shared_length(self, query: tuple[int, ...], limit: int) -> int:
        """The longest common prefix (at most `limit` tokens) of `query` with any key."""
        depth = -1  # the walk starts at the root (the empty prefix)
        try:
            for _ in self._trie.walk_towards(query[:limit]):
                depth += 1
        except KeyError:  # the query leaves the trie: `depth` is where
            pass
        return max(depth, 0)

    def longest(self, query: tuple[int, ...], limit: int) -> tuple[int, Optional[tuple[int, ...]]]:
        """(n, key): n = `shared_length`, key the smallest key starting with those n tokens; (0, None) when no key
        shares a first token."""
        depth = self.shared_length(query, limit)
        if depth == 0:
            return 0, None
        return depth, next(self._trie.iterkeys(prefix=query[:depth]))


@dataclass(eq=False)
class _Block:
    """KV of a run of tokens, stored once; `users` counts the entries whose segments read it."""

    kv: KV
    length: int
    users: int = 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.kv for t in pair)


@dataclass
class _Entry:
    """A cached sequence: its KV is the concatenation of the first `used` tokens of each segment's block."""

    segments: list[tuple[_Block, int]]


def _sliced_tail(kv: KV, start: int) -> KV:
    """`kv` from token `start` on, copied when start > 0: a view would keep the caller's whole tensor (the
    shared prefix included) alive."""
    if start == 0:
        return kv
    return [(k[:, start:].clone(), v[:, start:].clone()) for k, v in kv]


class PrefixCache:
    def __init__(self, max_tokens: int = 1 << 20):
        self.max_tokens = max_tokens  # budget in tokens of stored blocks (a shared prefix counts once)
        self._entries: "OrderedDict[tuple[int, ...], _Entry]" = OrderedDict()
        self._routing: dict[tuple[int, ...], torch.Tensor] = {}  # key -> [len(key), moe_layers, top_k]
        self._index = _KeyIndex()  # every entry's key
        self._routed_index = _KeyIndex()  # the keys that carry routing
        self._tokens = 0  # tokens of the blocks held
        self.hits = 0
        self.lookups = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held_tokens(self) -> int:
        """Tokens of KV actually stored (each block once), what the budget bounds."""
        return self._tokens

    def held_bytes(self) -> int:
        """Bytes of KV actually stored (each block once)."""
        return sum(block.nbytes() for block in self._blocks())

    def _blocks(self) -> Iterator[_Block]:
        seen: set[int] = set()
        for entry in self._entries.values():
            for block, _ in entry.segments:
                if id(block) not in seen:
                    seen.add(id(block))
                    yield block

    def insert(self, ids: Sequence[int], kv: KV, routing: Optional[torch.Tensor] = None) -> None:
        """Cache `kv` (per layer [heads, len(ids), dim]) as the KV of `ids`. The cache keeps the tensors
        themselves when nothing of `ids` is cached yet, else a copy of the part past the shared prefix."""
        key = self._key(ids, routing)
        if key is not None and any(k.shape[1] != len(key) for k, _ in kv):
            raise ValueError(f"KV length {kv[0][0].shape[1]} does not match {len(key)} token ids")
        self._insert(key, lambda start: _sliced_tail(kv, start), routing)

    def insert_from(self, ids: Sequence[int], tail: TailKV, routing: Optional[torch.Tensor] = None) -> None:
        """Like `insert`, but the KV is asked for only past the prefix the cache can share: `tail(start)`
        returns the KV of ids[start:] in storage the cache may keep (so a caller whose KV is in pieces never
        builds the full copy just to have most of it dropped)."""
        self._insert(self._key(ids, routing), tail, routing)

    def _key(self, ids: Sequence[int], routing: Optional[torch.Tensor]) -> Optional[tuple[int, ...]]:
        """The entry key for `ids`, or None when there is nothing to store (empty, or already cached: then
        the entry is refreshed and gains the routing it lacked)."""
        key = tuple(int(i) for i in ids)
        if routing is not None and routing.shape[0] != len(key):
            raise ValueError(f"routing length {routing.shape[0]} does not match {len(key)} token ids")
        if key in self._entries:
            self._entries.move_to_end(key)
            if routing is not None and key not in self._routing:
                self._routing[key] = routing
                self._routed_index.add(key)
            return None
        return key or None

    def _insert(self, key: Optional[tuple[int, ...]], tail: TailKV, routing: Optional[torch.Tensor]) -> None:
        if key is None:
            return
        segments, shared = self._shared_segments(key)
        if shared < len(key):
            kv = tail(shared)
            if any(k.shape[1] != len(key) - shared for k, _ in kv):
                raise ValueError(f"tail KV length {kv[0][0].shape[1]} does not match {len(key) - shared} tokens")
            segments.append((_Block(kv, len(key) - shared), len(key) - shared))
            self._tokens += len(key) - shared
        for block, _ in segments:
            block.users += 1
        self._entries[key] = _Entry(segments)
        self._index.add(key)
        if routing is not None:
            self._routing[key] = routing
            self._routed_index.add(key)
        self._evict()

    def _shared_segments(self, key: tuple[int, ...]) -> tuple[list[tuple[_Block, int]], int]:
        """Segments of the cached entry sharing the longest prefix with `key`, cut to that prefix, and the
        number of tokens they cover. A block only partly covered is shared when at least half of it is
        used, else that part is copied with the tail: a new entry must not pin a long block (say another
        prompt's, for a common chat-template prefix) to reuse a few of its tokens."""
        best, other = self._index.longest(key, len(key))
        source = self._entries[other] if other is not None else None
        segments: list[tuple[_Block, int]] = []
        covered = 0
        for block, used in source.segments if source is not None else ():
            take = min(used, best - covered)
            if take == 0 or (take < used and 2 * take < block.length):
                break
            segments.append((block, take))
            covered += take
        return segments, covered

    def _evict(self) -> None:
        """Least-recently-used entries go until the blocks held fit the budget (the newest entry stays). An
        evicted entry frees only the blocks no other entry uses, so evicting a prompt whose samples still
        reference its KV frees nothing until they go too."""
        while self._tokens > self.max_tokens and len(self._entries) > 1:
            old, entry = self._entries.popitem(last=False)
            self._routing.pop(old, None)
            self._index.discard(old)
            self._routed_index.discard(old)
            self._release(entry)

    def _release(self, entry: _Entry) -> None:
        for block, _ in entry.segments:
            block.users -= 1
            if block.users == 0:
                self._tokens -= block.length

    def _match(self, ids: Sequence[int], max_len: Optional[int], with_routing: bool) -> tuple[int, Optional[tuple[int, ...]]]:
        self.lookups += 1
        best_len, best_key = self._index_for(with_routing).longest(*self._query(ids, max_len))
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best_len
        return best_len, best_key

    def _kv(self, key: tuple[int, ...], n: int) -> KV:
        """The KV of the entry's first n tokens: a view when they lie in its first segment, else the
        segments' parts concatenated (only up to n)."""
        parts: list[tuple[_Block, int]] = []
        covered = 0
        for block, used in self._entries[key].segments:
            if covered >= n:
                break
            take = min(used, n - covered)
            parts.append((block, take))
            covered += take
        if len(parts) == 1:
            block, take = parts[0]
            return [(k[:, :take], v[:, :take]) for k, v in block.kv]
        out: KV = []
        for layer in range(len(parts[0][0].kv)):
            keys = torch.cat([block.kv[layer][0][:, :take] for block, take in parts], dim=1)
            values = torch.cat([block.kv[layer][1][:, :take] for block, take in parts], dim=1)
            out.append((keys, values))
        return out

    def longest_prefix(self, ids: Sequence[int], max_len: Optional[int] = None) -> tuple[int, Optional[KV]]:
        """(length, KV truncated to it) of the longest cached prefix of `ids`, at most `max_len` long."""
        n, key = self._match(ids, max_len, with_routing=False)
        if key is None:
            return 0, None
        return n, self._kv(key, n)

    def longest_prefix_routed(self, ids: Sequence[int], max_len: Optional[int] = None
                              ) -> tuple[int, Optional[KV], Optional[torch.Tensor]]:
        """(length, KV, routing [length, moe_layers, top_k]) of the longest cached prefix among the entries
        that carry routing (a request that records routed experts must not reuse a prefix whose routing is
        unknown: that prefix is recomputed)."""
        n, key = self._match(ids, max_len, with_routing=True)
        if key is None:
            return 0, None, None
        return n, self._kv(key, n), self._routing[key][:n]

    def prefix_length(self, ids: Sequence[int], max_len: Optional[int] = None, with_routing: bool = False) -> int:
        """Length of the longest cached prefix (no statistics, no reordering)."""
        return self._index_for(with_routing).shared_length(*self._query(ids, max_len))

    @staticmethod
    def _query(ids: Sequence[int], max_len: Optional[int]) -> tuple[tuple[int, ...], int]:
        """The lookup key of `ids` and how many of its tokens a match may cover."""
        query = tuple(int(i) for i in ids)
        return query, len(query) if max_len is None else min(max_len, len(query))

    def _index_for(self, with_routing: bool) -> _KeyIndex:
        return self._routed_index if with_routing else self._index

    def clear(self) -> None:
        self._entries.clear()
        self._routing.clear()
        self._index.clear()
        self._routed_index.clear()
        self._tokens = 0
