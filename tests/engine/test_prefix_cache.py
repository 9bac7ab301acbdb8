"""The prefix cache shares storage between entries: a sequence that extends a cached one stores only its tail.

Lookups must return what the former cache (one full KV copy per entry, kept below as `ReferenceCache`, a copy
of `PrefixCache` at commit 8662e84 that scans every entry) returned: same lengths, same KV values, same routing.
One policy differs from 8662e84, in both: of several entries sharing the longest prefix a lookup refreshes the
smallest key (what the trie index finds without a scan), where 8662e84 took the least recently used. The budget now
counts the tokens of the blocks held, each once, so n extensions of R tokens of a P-token prompt hold
P + n*R tokens where the former cache held P + n*(P + R); a block is freed only when its last user is evicted.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Optional, Sequence

import torch

from slime_ext.engine.prefix_cache import KV, PrefixCache, _KeyIndex

LAYERS, HEADS, DIM = 2, 2, 4
TOKEN_BYTES = LAYERS * 2 * HEADS * DIM * 4  # (K + V) per layer, fp32: 128 bytes
MOE_LAYERS, TOP_K = 2, 2


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...], limit: int) -> int:
    n = min(len(a), len(b), limit)
    return next((i for i in range(n) if a[i] != b[i]), n)


def kv_of(ids: Sequence[int]) -> KV:
    """Deterministic KV of a sequence in which each position depends on the whole prefix up to it, as with
    causal attention (so two sequences' KV agree exactly on their common prefix, and only there)."""
    h, rows = 17, []
    for t in ids:
        h = (h * 1_000_003 + int(t) + 1) % 2_147_483_647
        rows.append(torch.sin(h * 1e-3 * torch.arange(1, 2 * LAYERS * HEADS * DIM + 1, dtype=torch.float64)))
    if not rows:
        return [(torch.zeros(HEADS, 0, DIM), torch.zeros(HEADS, 0, DIM)) for _ in range(LAYERS)]
    x = torch.stack(rows).float().view(len(ids), LAYERS, 2, HEADS, DIM)
    return [(x[:, layer, 0].transpose(0, 1).contiguous(), x[:, layer, 1].transpose(0, 1).contiguous())
            for layer in range(LAYERS)]


def routing_of(ids: Sequence[int]) -> torch.Tensor:
    """Deterministic routing [len, moe_layers, top_k]: a function of the token and its position."""
    t = torch.tensor(list(ids), dtype=torch.int16)[:, None, None]
    pos = torch.arange(len(ids), dtype=torch.int16)[:, None, None]
    return (t + pos + torch.arange(MOE_LAYERS * TOP_K, dtype=torch.int16).view(1, MOE_LAYERS, TOP_K)) % 8


def stored_bytes(cache: PrefixCache) -> int:
    """Bytes of the distinct storages the cache's entries reach (a view counts its whole storage, so a tail
    kept as a view of the caller's full copy would show here)."""
    storages = {}
    for entry in cache._entries.values():
        for block, _ in entry.segments:
            for pair in block.kv:
                for t in pair:
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


# The former cache, verbatim: one full KV copy per entry, budget = sum of the entries' lengths.
class ReferenceCache:
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
            if n > best_len or (n == best_len and n > 0 and key < best_key):  # ties: the smallest key
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


def _assert_same_kv(got: Optional[KV], want: Optional[KV]) -> None:
    assert (got is None) == (want is None)
    if want is not None:
        assert len(got) == len(want)
        for (gk, gv), (wk, wv) in zip(got, want):
            assert torch.equal(gk, wk) and torch.equal(gv, wv)


def _assert_same_lookup(cache: PrefixCache, ref: ReferenceCache, rng: random.Random, query: list[int]) -> None:
    max_len = None if rng.random() < 0.3 else rng.randint(0, len(query) + 2)
    kind = rng.randrange(3)
    if kind == 0:
        (n, kv), (m, want) = cache.longest_prefix(query, max_len), ref.longest_prefix(query, max_len)
        assert n == m
        _assert_same_kv(kv, want)
    elif kind == 1:
        (n, kv, routing) = cache.longest_prefix_routed(query, max_len)
        (m, want, want_routing) = ref.longest_prefix_routed(query, max_len)
        assert n == m
        _assert_same_kv(kv, want)
        assert (routing is None and want_routing is None) or torch.equal(routing, want_routing)
    else:
        with_routing = rng.random() < 0.5
        assert cache.prefix_length(query, max_len, with_routing) == ref.prefix_length(query, max_len, with_routing)
    assert (cache.hits, cache.lookups, cache.hit_tokens) == (ref.hits, ref.lookups, ref.hit_tokens)


def _insert_both(cache: PrefixCache, ref: ReferenceCache, rng: random.Random, ids: list[int]) -> None:
    routing = routing_of(ids) if rng.random() < 0.5 else None
    if rng.random() < 0.5:
        cache.insert(ids, kv_of(ids), routing)
    else:
        cache.insert_from(ids, lambda start: [(k[:, start:].clone(), v[:, start:].clone())
                                                                  for k, v in kv_of(ids)], routing)
    ref.insert(ids, kv_of(ids), routing)


def _check_held(cache: PrefixCache) -> None:
    """The token count is the distinct blocks' tokens, and they are all the storage the cache keeps."""
    blocks = {id(b): b for e in cache._entries.values() for b, _ in e.segments}
    assert cache.held_tokens == sum(b.length for b in blocks.values())
    assert stored_bytes(cache) == cache.held_bytes() == cache.held_tokens * TOKEN_BYTES
    assert cache.held_tokens <= cache.max_tokens or len(cache) == 1


def _related_sequence(rng: random.Random, inserted: list[list[int]]) -> list[int]:
    """A cached sequence cut somewhere and extended (a continuation, another sample), or a fresh one; tokens
    from a small vocabulary so unrelated sequences often share a few first tokens too."""
    if inserted and rng.random() < 0.75:
        base = rng.choice(inserted)
        return base[:rng.randint(0, len(base))] + [rng.randrange(5) for _ in range(rng.randint(0, 12))]
    return [rng.randrange(5) for _ in range(rng.randint(1, 30))]


def test_lookups_match_the_former_cache_when_entries_share_prefixes():
    """Random inserts and lookups over related sequences. The budgets differ in what they count, so the
    reference gets an unbounded budget and drops what the new cache evicted: those must be its
    least-recently-used entries, and then every lookup must return the same as the former cache."""
    for seed in range(6):
        rng = random.Random(seed)
        cache, ref = PrefixCache(max_tokens=rng.choice([40, 80, 160, 10_000])), ReferenceCache(max_tokens=1 << 30)
        inserted: list[list[int]] = []
        for _ in range(300):
            if rng.random() < 0.4:
                ids = _related_sequence(rng, inserted)
                _insert_both(cache, ref, rng, ids)
                inserted.append(ids)
                evicted = [k for k in ref._entries if k not in cache._entries]
                assert evicted == list(ref._entries)[:len(evicted)]  # LRU order
                for key in evicted:
                    ref._entries.pop(key)
                    ref._routing.pop(key, None)
                assert list(cache._entries) == list(ref._entries)
                _check_held(cache)
            else:
                _assert_same_lookup(cache, ref, rng, _related_sequence(rng, inserted))
        if cache.max_tokens < 10_000:
            assert len(inserted) > len(cache)  # the budget did evict


def test_lookups_and_evictions_match_the_former_cache_without_shared_prefixes():
    """Sequences with distinct first tokens share nothing, so both caches count the same tokens: same budget,
    same evictions, same lookups (of prefixes and extensions of what was inserted)."""
    for seed in range(4):
        rng = random.Random(100 + seed)
        budget = rng.choice([30, 60, 120])
        cache, ref = PrefixCache(max_tokens=budget), ReferenceCache(max_tokens=budget)
        inserted: list[list[int]] = []
        for step in range(300):
            if rng.random() < 0.4:
                ids = rng.choice(inserted) if inserted and rng.random() < 0.2 else \
                    [1000 + step] + [rng.randrange(5) for _ in range(rng.randint(0, 25))]
                _insert_both(cache, ref, rng, ids)
                inserted.append(ids)
                assert list(cache._entries) == list(ref._entries)
                assert cache.held_tokens == ref._tokens
                _check_held(cache)
            else:
                base = rng.choice(inserted) if inserted else [7]
                query = base[:rng.randint(0, len(base))] + [rng.randrange(5) for _ in range(rng.randint(0, 5))]
                _assert_same_lookup(cache, ref, rng, query)
        assert len(inserted) > len(cache)


def test_n_extensions_of_a_prompt_hold_the_prompt_once():
    P, n, R = 50, 8, 10
    rng = random.Random(0)
    prompt = [rng.randrange(100) for _ in range(P)]
    samples = [prompt + [100 + i] + [rng.randrange(100) for _ in range(R - 1)] for i in range(n)]
    for via in ("insert", "insert_from"):
        cache, ref = PrefixCache(), ReferenceCache()
        asked = []
        for ids in [prompt] + samples:
            ref.insert(ids, kv_of(ids))
            if via == "insert":
                cache.insert(ids, kv_of(ids))
            else:
                cache.insert_from(ids, lambda start, ids=ids: asked.append(start) or
                                  [(k[:, start:].clone(), v[:, start:].clone()) for k, v in kv_of(ids)])
        # blocks: the prompt's 50 tokens once, and each sample's 10 own tokens: 50 + 8 * 10 = 130 tokens,
        # 130 * 128 bytes = 16,640 bytes; the former cache: 50 + 8 * 60 = 530 tokens, 67,840 bytes
        assert cache.held_tokens == P + n * R == 130
        assert stored_bytes(cache) == cache.held_bytes() == 130 * TOKEN_BYTES == 16_640
        assert ref._tokens == P + n * (P + R) == 530
        assert sum(t.numel() * t.element_size() for kv in ref._entries.values() for pair in kv for t in pair) == 67_840
        if via == "insert_from":
            assert asked == [0] + [P] * n  # the tail only was asked for
        for ids in [prompt] + samples:
            _assert_same_kv(cache.longest_prefix(ids)[1], kv_of(ids))


def test_a_lookup_inside_the_first_segment_is_a_view():
    cache = PrefixCache()
    prompt, sample = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8]
    cache.insert(prompt, kv_of(prompt))
    cache.insert(sample, kv_of(sample))
    block = cache._entries[tuple(prompt)].segments[0][0]
    n, kv = cache.longest_prefix([1, 2, 3, 4, 9])
    assert n == 4 and kv[1][0].data_ptr() == block.kv[1][0].data_ptr()  # no copy
    n, kv = cache.longest_prefix(sample + [9], max_len=7)  # across the prompt's block and the sample's own
    assert n == 7
    _assert_same_kv(kv, kv_of(sample[:7]))


def test_eviction_frees_a_block_only_when_its_last_user_goes():
    P, R = 20, 5
    prompt = list(range(10, 10 + P))
    s1, s2 = prompt + [1] * R, prompt + [2] * R
    cache = PrefixCache(max_tokens=P + 2 * R)
    for ids in (prompt, s1, s2):
        cache.insert(ids, kv_of(ids))
    assert cache.held_tokens == 30 and len(cache) == 3
    cache.insert([0], kv_of([0]))  # 31 tokens: the prompt's entry goes, but s1 and s2 still use its block
    # and then s1 goes (its 5 own tokens are freed): 26 tokens
    assert list(cache._entries) == [tuple(s2), (0,)]
    assert cache.held_tokens == P + R + 1 == 26 and stored_bytes(cache) == 26 * TOKEN_BYTES
    n, kv = cache.longest_prefix(prompt + [3])  # the prompt's KV is still there, through s2 (now most recent)
    assert n == P and list(cache._entries) == [(0,), tuple(s2)]
    _assert_same_kv(kv, kv_of(prompt))
    cache.insert([1] * 6, kv_of([1] * 6))  # 32 tokens: [0] goes (31), then s2, the prompt block's last user
    assert list(cache._entries) == [(1,) * 6]
    assert cache.held_tokens == 6 and stored_bytes(cache) == 6 * TOKEN_BYTES
    assert cache.longest_prefix(prompt)[0] == 0


def test_a_short_shared_part_of_a_long_block_is_copied_not_pinned():
    """Sharing 5 of another sequence's 40 tokens would keep all 40 alive for 5: they are copied instead;
    sharing at least half of a block references it."""
    a = list(range(40))
    short, long = a[:5] + [99] * 10, a[:25] + [99] * 10
    cache = PrefixCache()
    cache.insert(a, kv_of(a))
    cache.insert(short, kv_of(short))
    assert cache.held_tokens == 40 + 15 and len(cache._entries[tuple(short)].segments) == 1
    cache.insert(long, kv_of(long))
    assert cache.held_tokens == 40 + 15 + 10 and len(cache._entries[tuple(long)].segments) == 2
    for ids in (a, short, long):
        _assert_same_kv(cache.longest_prefix(ids)[1], kv_of(ids))


def test_the_key_index_finds_the_longest_shared_prefix_and_the_smallest_key_sharing_it():
    """Hand-worked lookups of the trie index the cache uses instead of a scan over every entry."""
    index = _KeyIndex()
    for key in [(1, 2, 3), (1, 2), (1, 5), (1, 2, 0, 9)]:
        index.add(key)
    assert index.longest((1, 2, 3, 4), 4) == (3, (1, 2, 3))
    assert index.longest((1, 2, 3, 4), 2) == (2, (1, 2))  # the limit cuts the match; (1, 2) < (1, 2, 0, 9)
    assert index.longest((1, 7), 2) == (1, (1, 2))  # four keys share (1,): the smallest
    assert index.longest((9, 1), 2) == (0, None)
    assert index.longest((1, 2), 0) == (0, None)
    index.discard((1, 2))
    index.discard((4, 4))  # not there: nothing happens
    assert index.longest((1, 2, 7), 3) == (2, (1, 2, 0, 9))
    index.clear()
    assert index.longest((1, 2, 3), 3) == (0, None)
