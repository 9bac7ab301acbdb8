"""SxS's `speak_only` request extension of the engine server: only the speak channel reaches the user.

Registered in the SxS entries of the method registry (`serving`); the server builds it with the served
tokenizer and knows it by its body field only. A request with `speak_only` runs the SxS channel sampler (tags
enforced unless `enforce_tags: false`); the answer, or the stream, keeps speak-channel tokens without the tags.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from sglang_patches.request_sampler import RequestView
from sglang_patches.sxs import SPEAK, SxSChannelSampler, tag_ids, visible_token_ids
from slime_ext.data.generation import GenerateResult


class SpeakOnlyStream:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.tags = tag_ids(tokenizer)  # ValueError: this tokenizer has no SxS tags (the server answers 400)

    def sampler_spec(self, body: Optional[dict[str, Any]] = None) -> dict:
        """The spec of the channel sampler each such request runs (`enforce_tags: false` in the request body
        lets the model skip the tags)."""
        enforce = (body or {}).get("enforce_tags") is not False
        return {"kind": "sxs_channel", **self.tags, "enforce": enforce}

    def visible_text(self, result: GenerateResult) -> str:
        channels = [int(a.get("channel", 0)) for a in result.annotations]
        return self.tokenizer.decode(visible_token_ids(result.output_ids, channels, self.tags), skip_special_tokens=True)

    def tracker(self) -> Callable[[int], bool]:
        """A per-stream function: feed each emitted token, get whether the user may see it."""
        tracker = SxSChannelSampler(0, **self.tags, enforce=False)
        view = RequestView("stream", 0, [], [], self.tokenizer.eos_token_id)
        tag_set = set(self.tags.values())

        def visible(tok: int) -> bool:
            return tracker.on_token(tok, view)["channel"] == SPEAK and tok not in tag_set

        return visible
