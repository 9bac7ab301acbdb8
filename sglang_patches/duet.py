"""DUET's marker-gated early stop (docs/methods/duet.md), as a per-request sampler.

Every `poll` tokens once the response has `k1` tokens, the last `window` decoded tokens are checked for
the task's answer marker (math: a closed `\\boxed{...}`, braces nested; code: a closing ``` fence at
column 0 paired with an opening one; QA: `<answer>...</answer>` or "Therefore the answer is X").

- Marker found at tau: tail-trim, i.e. EOS is forced at the next low-entropy step (the model is only
  formatting), at the latest at tau + grace.
- No marker by k2 + grace: a coin from the request's own stream aborts the rollout with probability
  1 - eps_abort (EOS forced, annotated `did_abort`, keep propensity 0) or keeps it to its natural end
  with propensity eps_abort (annotated; the trainer weighs it 1 / eps_abort).

Decisions that the tokens determine (marker, the coin) are taken in `on_token`, so
`replay_annotations` reproduces them from seed + tokens; the entropy trim looks at logits in `adjust`
and leaves no annotation (a trimmed rollout is an ordinary kept rollout ending in EOS).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import torch

from sglang_patches.boxed_answer import find_last_boxed
from sglang_patches.request_sampler import CoinStream, RequestView, Sampler, StepAction, register_sampler

_QA_ANSWER = re.compile(r"<answer>.*?</answer>", re.DOTALL)
_QA_THEREFORE = re.compile(r"Therefore,?\s+the answer is\s+\S+", re.IGNORECASE)


def math_marker(text: str) -> bool:
    """A closed `\\boxed{...}` (the verifier's own extractor: nested and escaped braces handled)."""
    return find_last_boxed(text)[0] is not None


def code_marker(text: str) -> bool:
    """A fence line at column 0 that closes an earlier opening fence."""
    fences = [line for line in text.split("\n") if line.startswith("```")]
    return len(fences) >= 2


def qa_marker(text: str) -> bool:
    return bool(_QA_ANSWER.search(text) or _QA_THEREFORE.search(text))


MARKERS: dict[str, Callable[[str], bool]] = {"math": math_marker, "code": code_marker, "qa": qa_marker}


def entropy(logits: torch.Tensor) -> float:
    logp = torch.log_softmax(logits.float(), dim=-1)
    return float(-(logp.exp() * logp).nan_to_num().sum())


@register_sampler
class DuetGateSampler(Sampler):
    kind = "duet_gate"
    needs_decode = True

    def __init__(self, seed: int, k1: int, k2: int, grace: int = 150, poll: int = 8, window: int = 256,
                 eps_abort: float = 0.05, task: str = "math", trim_entropy: float = 0.3):
        super().__init__(seed)
        if task not in MARKERS:
            raise ValueError(f"duet marker task {task!r} unknown; expected one of {sorted(MARKERS)}")
        if not 0 < eps_abort <= 1:
            raise ValueError(f"eps_abort must lie in (0, 1], got {eps_abort}")
        if k1 > k2:
            raise ValueError(f"duet gate needs k1 <= k2, got {k1} > {k2}")
        self.k1, self.k2, self.grace, self.poll, self.window = int(k1), int(k2), int(grace), int(poll), int(window)
        self.eps_abort, self.task, self.trim_entropy = float(eps_abort), task, float(trim_entropy)
        self.coins = CoinStream(seed, "duet-gate")
        self.marker_at: Optional[int] = None
        self.decision: Optional[str] = None  # "abort" | "keep" once the gate has drawn

    def on_token(self, token_id: int, view: RequestView) -> dict[str, Any]:
        n = view.step + 1  # response length including this token
        note: dict[str, Any] = {}
        if self.marker_at is None and self.decision is None and n >= self.k1 and n % self.poll == 0:
            if view.decode is None:
                raise RuntimeError(f"request {view.rid}: the duet gate needs a tokenizer to decode")
            tail = view.decode(list(view.output_ids[-(self.window - 1):]) + [int(token_id)])
            if MARKERS[self.task](tail):
                self.marker_at = n
                note["duet_marker"] = n
        if self.marker_at is None and self.decision is None and n >= self.k2 + self.grace:
            keep = self.coins.bernoulli(self.eps_abort)
            self.decision = "keep" if keep else "abort"
            note.update(did_abort=not keep, keep_propensity=self.eps_abort if keep else 0.0)
        return note

    def adjust(self, logits: torch.Tensor, partner_logits: Optional[torch.Tensor], view: RequestView) -> StepAction:
        if self.decision == "abort":
            return StepAction(finish=True)
        if self.marker_at is not None:
            if view.step >= self.marker_at + self.grace or entropy(logits) < self.trim_entropy:
                return StepAction(finish=True)
        return StepAction()


def gate_outcome(annotations: list[dict[str, Any]]) -> tuple[bool, float, Optional[int]]:
    """(did_abort, keep propensity, marker position) of a finished rollout from its annotations: a
    rollout without a gate draw kept with propensity 1 (it reached its marker or ended before k2 + G)."""
    did_abort, propensity, marker = False, 1.0, None
    for note in annotations:
        if "did_abort" in note:
            did_abort, propensity = bool(note["did_abort"]), float(note["keep_propensity"])
        if "duet_marker" in note:
            marker = int(note["duet_marker"])
    return did_abort, 0.0 if did_abort else propensity, marker


def gate_drawn_at(annotations: list[dict[str, Any]]) -> Optional[int]:
    """Response length (k2 + grace) at which the gate drew its abort coin, None when it never drew
    (the rollout reached its marker or ended before). An aborted rollout ends one token later (the
    forced EOS); an eps-kept one runs on, and its tokens past `gate_drawn_at + 1` are the only ones the
    budget does not cover."""
    for i, note in enumerate(annotations):
        if "did_abort" in note:
            return i + 1
    return None
