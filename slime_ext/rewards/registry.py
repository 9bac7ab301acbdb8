"""Look verifiers up by the name a task config uses ("math", "multiple_choice", "code")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from slime_ext.rewards.code_verifier import verify_code
from slime_ext.rewards.math_verifier import verify_math
from slime_ext.rewards.multiple_choice import verify_choice
from slime_ext.rewards.result import VerifyResult

Verifier = Callable[[str, Any], VerifyResult]

_VERIFIERS: dict[str, Verifier] = {
    "math": verify_math,
    "multiple_choice": verify_choice,
    "code": verify_code,  # label: the test code (str or list of assert statements)
}


def available_verifiers() -> list[str]:
    return sorted(_VERIFIERS)


def get_verifier(name: str) -> Verifier:
    """The ``(response, label) -> VerifyResult`` callable registered under ``name``."""
    try:
        return _VERIFIERS[name]
    except KeyError:
        raise KeyError(f"unknown verifier {name!r}; available: {available_verifiers()}") from None
