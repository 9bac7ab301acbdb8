"""DA-GRPO's help trigger (docs/methods/dagrpo.md), as a per-request sampler.

When the decoded response ends with the trigger (`I need external assistance.` by default), the local
response ends there: the token is annotated `asked_for_help` and the next step forces EOS. The
composition with the cloud's completion happens after generation (`slime_ext.methods.dagrpo.splice`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from sglang_patches.request_sampler import RequestView, Sampler, StepAction, register_sampler

DEFAULT_TRIGGER = "I need external assistance."


@register_sampler
class HelpTriggerSampler(Sampler):
    kind = "dagrpo_trigger"
    needs_decode = True

    def __init__(self, seed: int, trigger: str = DEFAULT_TRIGGER, window: int = 32):
        super().__init__(seed)
        if not trigger:
            raise ValueError("the help trigger must be a non-empty string")
        self.trigger, self.window = trigger, int(window)
        self.asked_at: Optional[int] = None

    def on_token(self, token_id: int, view: RequestView) -> dict[str, Any]:
        if self.asked_at is not None:
            return {}
        if view.decode is None:
            raise RuntimeError(f"request {view.rid}: the help trigger needs a tokenizer to decode")
        tail = view.decode(list(view.output_ids[-(self.window - 1):]) + [int(token_id)])
        if tail.rstrip().endswith(self.trigger):
            self.asked_at = view.step + 1
            return {"asked_for_help": True}
        return {}

    def adjust(self, logits: torch.Tensor, partner_logits: Optional[torch.Tensor], view: RequestView) -> StepAction:
        return StepAction(finish=True) if self.asked_at is not None else StepAction()
