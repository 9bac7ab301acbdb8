"""The `sxs` config section."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

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

    def data_transform(self, config: Any) -> Any:
        """`sxs.interleave_data`: each synthetic solution becomes its think/speak interleaving."""
        if not self.interleave_data:
            return None
        from slime_ext.methods.sxs.interleave import interleave_row

        return interleave_row
