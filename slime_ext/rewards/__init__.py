"""Verifiers that turn a model response into a reward, plus the reason it got that reward.

Hostile or malformed output never raises and never hangs: it scores 0 with a reason.
"""

from sglang_patches.boxed_answer import extract_last_boxed
from slime_ext.rewards.code_verifier import extract_code_block, verify_code
from slime_ext.rewards.math_verifier import compare_math, math_equal, verify_math
from slime_ext.rewards.multiple_choice import verify_choice
from slime_ext.rewards.normalize import normalize_answer
from slime_ext.rewards.registry import available_verifiers, get_verifier
from slime_ext.rewards.result import ReasonCounter, VerifyResult

__all__ = [
    "ReasonCounter",
    "VerifyResult",
    "available_verifiers",
    "compare_math",
    "extract_code_block",
    "extract_last_boxed",
    "get_verifier",
    "math_equal",
    "normalize_answer",
    "verify_choice",
    "verify_code",
    "verify_math",
]
