"""The `sxs` config section."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from slime_ext.config.sections import Section


class SxSConfig(Section):
    """SxS's settings (docs/methods/sxs.md)."""

    enforce_tags: bool = True
    qp_shaping: bool = False
    qp_eps: float = Field(0.5, gt=0)
    s_min: float = Field(3.0, gt=0)  # shaping target of incorrect rollouts: -s_min (paper eq. 14)
    drop_uniform_groups: bool = True
    judge_url: Optional[str] = None
    judge_concurrency: int = Field(8, ge=1)
    # Replace each synthetic reference solution by its think/speak interleaving (Algorithm 1, rule oracle):
    # the data the SxS SFT warm start trains on (true in both SxS configs)
    interleave_data: bool = False
    # With interleave_data: where the user-facing account goes ("after_reasoning": the study's control, the same
    # text with the whole account after the reasoning) and the share of intermediate steps whose running total it
    # reports (< 1: think blocks span one to several steps, so the pacing can change; slime_ext/methods/sxs/synthetic.py)
    answer_placement: Literal["interleaved", "after_reasoning"] = "interleaved"
    disclosure_share: float = Field(1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _data_settings_need_the_data(self) -> "SxSConfig":
        if not self.interleave_data:
            for key, default in (("answer_placement", "interleaved"), ("disclosure_share", 1.0)):
                if getattr(self, key) != default:
                    raise ValueError(f"sxs.{key} = {getattr(self, key)!r} shapes the interleaved SFT data: it needs "
                                     "sxs.interleave_data = true")
        return self

    def data_transform(self, config: Any) -> Any:
        """`sxs.interleave_data`: each synthetic solution becomes its think/speak interleaving (or the control's
        layout, `sxs.answer_placement`)."""
        if not self.interleave_data:
            return None
        from slime_ext.methods.sxs.interleave import SxSRows, interleave_row

        rows = SxSRows(self.answer_placement, self.disclosure_share)
        return interleave_row if rows == SxSRows() else rows
