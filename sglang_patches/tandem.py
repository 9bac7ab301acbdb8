"""Tandem RL's author state machine (docs/methods/tandem.md), as a per-request sampler.

A trained senior (the host's main model) and a frozen junior (the partner model) run in lockstep on
the same context; each step the token is sampled from `author_next`'s distribution and annotated with
its author (SENIOR = `Author.POLICY` = 1, JUNIOR = `Author.PARTNER` = 0). After the emitted token,
`since += 1`; if the token is in the boundary set (word-initial tokens) or `since >= kappa`,
`author_next ~ Bernoulli(p)` is redrawn and `since` reset. So a word-initial token is emitted by the
current author and the coin governs the token after it: the reference code's semantics.

Pitfalls of the reference code this avoids: the state lives in the per-request object (a request that
is not scheduled in a step keeps it), it advances only in `on_token` (emitted response tokens, never
throw-away prefill samples), and coins come from the request's own `CoinStream`, separate from token
sampling, so authorship depends only on the seed and the request's own tokens.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, Optional, Sequence

import torch

from sglang_patches.request_sampler import CoinStream, RequestView, Sampler, StepAction, register_sampler
from slime_ext.data.sample import Author

# The author values this sampler annotates, as plain ints (sampler state and annotations cross process
# boundaries); `slime_ext.data.sample.Author` defines them.
SENIOR, JUNIOR = int(Author.POLICY), int(Author.PARTNER)
WORD_MARKERS = ("\u0120", "\u2581")  # byte-level BPE ("Ġ", GPT-2 / Qwen) and SentencePiece ("▁")


def boundary_ids_from_vocab(vocab: dict[str, int], marker: Optional[str] = None) -> list[int]:
    """Ids of tokens whose surface string starts with the word-initial marker.

    The marker is detected from the vocabulary when not given: the one of `WORD_MARKERS` that starts
    the most tokens. A vocabulary with neither is an error (no word boundaries to hand off at).
    """
    if marker is None:
        counts = {m: sum(tok.startswith(m) for tok in vocab) for m in WORD_MARKERS}
        marker = max(counts, key=counts.get)
        if counts[marker] == 0:
            raise ValueError(f"no token starts with a word-initial marker {WORD_MARKERS}; pass `marker`")
    return sorted(i for tok, i in vocab.items() if tok.startswith(marker))


@lru_cache(maxsize=8)
def boundary_ids_for_tokenizer(path: str) -> tuple[int, ...]:
    """Boundary set of the tokenizer saved at `path` (cached per process: SGLang builds one sampler
    per request, and a Qwen3 vocabulary has ~150k entries)."""
    from transformers import AutoTokenizer

    return tuple(boundary_ids_from_vocab(AutoTokenizer.from_pretrained(path).get_vocab()))


def check_same_vocabulary(senior_vocab: dict[str, int], junior_vocab: dict[str, int]) -> None:
    """Tandem needs token ids to mean the same thing to both models; refuse otherwise."""
    if senior_vocab == junior_vocab:
        return
    only_s = sorted(set(senior_vocab) - set(junior_vocab))[:5]
    only_j = sorted(set(junior_vocab) - set(senior_vocab))[:5]
    moved = sorted(t for t in set(senior_vocab) & set(junior_vocab) if senior_vocab[t] != junior_vocab[t])[:5]
    raise ValueError(
        f"senior and junior vocabularies differ ({len(senior_vocab)} vs {len(junior_vocab)} tokens; "
        f"only in senior: {only_s}, only in junior: {only_j}, different ids: {moved}); "
        "tandem rollouts need identical vocabularies"
    )


@register_sampler
class TandemSampler(Sampler):
    """Per-request author state: `author_next`, `since`, and the request's coin stream."""

    kind = "tandem"
    needs_partner = True

    def __init__(self, seed: int, p_senior: float = 0.5, kappa: int = 32,
                 boundary_ids: Optional[Sequence[int]] = None, tokenizer_path: Optional[str] = None):
        super().__init__(seed)
        if not 0.0 <= p_senior <= 1.0:
            raise ValueError(f"tandem p_senior must lie in [0, 1], got {p_senior}")
        if kappa < 1:
            raise ValueError(f"tandem kappa must be >= 1, got {kappa}")
        if (boundary_ids is None) == (tokenizer_path is None):
            raise ValueError("tandem sampler needs exactly one of boundary_ids or tokenizer_path")
        self.p_senior = float(p_senior)
        self.kappa = int(kappa)
        self.tokenizer_path = tokenizer_path
        self._boundary = frozenset(boundary_ids if boundary_ids is not None else boundary_ids_for_tokenizer(tokenizer_path))
        self.coins = CoinStream(seed, "tandem-author")
        self.author_next = SENIOR if self.coins.bernoulli(self.p_senior) else JUNIOR
        self.since = 0
        self.fresh = True  # the next token's author comes from a draw not yet used by any token

    def adjust(self, logits: torch.Tensor, partner_logits: Optional[torch.Tensor], view: RequestView) -> StepAction:
        if self.author_next == SENIOR:
            return StepAction()
        if partner_logits is None:
            raise RuntimeError(f"request {view.rid}: the tandem junior's turn came but the host gave no partner logits")
        return StepAction(logits=partner_logits)

    def on_token(self, token_id: int, view: RequestView) -> dict[str, Any]:
        """Annotate the token's author (and whether a fresh draw decided it), then advance the state."""
        note = {"author": self.author_next, "author_drawn": self.fresh}
        self.fresh = False
        self.since += 1
        if token_id in self._boundary or self.since >= self.kappa:
            self.author_next = SENIOR if self.coins.bernoulli(self.p_senior) else JUNIOR
            self.since = 0
            self.fresh = True
        return note

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["_boundary"] = sorted(self._boundary)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self._boundary = frozenset(state.pop("_boundary", self._boundary))
        super().load_state_dict(state)


def author_runs(authors: Iterable[int]) -> list[tuple[int, int]]:
    """(author, run length) pairs of a response's author sequence."""
    runs: list[tuple[int, int]] = []
    for a in authors:
        if runs and runs[-1][0] == a:
            runs[-1] = (a, runs[-1][1] + 1)
        else:
            runs.append((int(a), 1))
    return runs
