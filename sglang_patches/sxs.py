"""SxS channel tracking (docs/methods/sxs.md), as a per-request sampler.

Annotates every token with its channel: tokens inside `<think>...</think>` (tags included) are THINK,
inside `<speak>...</speak>` SPEAK; tokens outside any block count as THINK (private unless a speak block
says otherwise). With `enforce=True` the sampler keeps the tag structure well formed: outside a block
only an opening tag or EOS may follow; inside a block no tag may open and only the matching tag may
close; EOS only outside a block.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from sglang_patches.request_sampler import RequestView, Sampler, StepAction, register_sampler
from slime_ext.data.sample import Channel

# The channel values this sampler annotates, as plain ints (annotations cross process boundaries);
# `slime_ext.data.sample.Channel` defines them.
THINK, SPEAK = int(Channel.THINK), int(Channel.SPEAK)


@register_sampler
class SxSChannelSampler(Sampler):
    kind = "sxs_channel"

    def __init__(self, seed: int, think_open: int, think_close: int, speak_open: int, speak_close: int,
                 enforce: bool = True):
        super().__init__(seed)
        self.tags = {"think_open": int(think_open), "think_close": int(think_close),
                     "speak_open": int(speak_open), "speak_close": int(speak_close)}
        self.enforce = bool(enforce)
        self.inside: Optional[str] = None  # None, "think" or "speak"

    def adjust(self, logits: torch.Tensor, partner_logits: Optional[torch.Tensor], view: RequestView) -> StepAction:
        if not self.enforce:
            return StepAction()
        t = self.tags
        out = logits.clone()
        if self.inside is None:
            allowed = torch.full_like(out, float("-inf"))
            for tok in (t["think_open"], t["speak_open"], view.eos_token_id):
                allowed[tok] = out[tok]
            return StepAction(logits=allowed)
        banned = [t["think_open"], t["speak_open"], view.eos_token_id,
                  t["speak_close"] if self.inside == "think" else t["think_close"]]
        out[banned] = float("-inf")
        return StepAction(logits=out)

    def on_token(self, token_id: int, view: RequestView) -> dict[str, Any]:
        t = self.tags
        if token_id in (t["think_open"], t["speak_open"]) and self.inside is None:
            self.inside = "think" if token_id == t["think_open"] else "speak"
            return {"channel": THINK if self.inside == "think" else SPEAK}
        if token_id in (t["think_close"], t["speak_close"]) and self.inside is not None:
            channel = THINK if self.inside == "think" else SPEAK
            self.inside = None
            return {"channel": channel}
        return {"channel": SPEAK if self.inside == "speak" else THINK}


def visible_token_ids(output_ids: list[int], channels: list[int], tags: dict[str, int]) -> list[int]:
    """The user-visible projection: speak-channel tokens without the tags themselves."""
    tag_set = set(tags.values())
    return [tok for tok, ch in zip(output_ids, channels) if ch == SPEAK and tok not in tag_set]


TAG_TOKENS = ("<think>", "</think>", "<speak>", "</speak>")


def tag_ids(tokenizer: Any) -> dict[str, int]:
    """The four tag tokens' ids (a tokenizer without them cannot run SxS)."""
    ids = tokenizer.convert_tokens_to_ids(list(TAG_TOKENS))
    unk = getattr(tokenizer, "unk_token_id", None)
    missing = [t for t, i in zip(TAG_TOKENS, ids) if i is None or (unk is not None and i == unk)]
    if missing:
        raise ValueError(f"SxS needs the tag tokens {missing} in the tokenizer's vocabulary")
    return dict(zip(("think_open", "think_close", "speak_open", "speak_close"), (int(i) for i in ids)))
