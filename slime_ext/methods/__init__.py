"""Training methods behind the plan / finish / update hooks; `build_method` picks one by config."""

from slime_ext.config.schema import Config
from slime_ext.methods.base import Method, PromptPlan
from typing import Any, Optional

from slime_ext.methods.dagrpo import DAGRPO, CollabGRPO
from slime_ext.methods.dapo import DAPO
from slime_ext.methods.duet import Duet
from slime_ext.methods.duet_tandem import DuetTandem
from slime_ext.methods.grpo import GRPO
from slime_ext.methods.sxs import SxS
from slime_ext.methods.tandem import Tandem, TandemKLReg

IMPLEMENTED = {"grpo": GRPO, "tandem": Tandem, "tandem_klreg": TandemKLReg, "duet": Duet, "duet_tandem": DuetTandem,
               "dapo": DAPO, "sxs_sft": SxS, "sxs_rl": SxS, "dagrpo": DAGRPO, "collab_grpo": CollabGRPO}
NEEDS_TOKENIZER = (Tandem, SxS, DAGRPO)  # DuetTandem is a Tandem


def build_method(config: Config, tokenizer: Optional[Any] = None) -> Method:
    if config.method not in IMPLEMENTED:
        raise NotImplementedError(
            f"method {config.method!r} is configured but not implemented yet (implemented: {sorted(IMPLEMENTED)})"
        )
    cls = IMPLEMENTED[config.method]
    return cls(config, tokenizer) if issubclass(cls, NEEDS_TOKENIZER) else cls(config)


__all__ = ["Method", "PromptPlan", "GRPO", "Tandem", "TandemKLReg", "Duet", "DuetTandem", "DAPO", "SxS", "DAGRPO",
           "CollabGRPO", "build_method", "IMPLEMENTED"]
