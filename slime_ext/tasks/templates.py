"""Prompt templates: how a dataset question is wrapped before tokenisation.

Why a registry: the tiny locally trained model is fine-tuned on a bare
"Question/Answer" frame, while real chat models (Qwen3) expect their chat
markup; both the SFT data builder and the rollout side must use the exact same
string, so the template is chosen once, by name, from config.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PromptTemplate", "TEMPLATES", "DEFAULT_TEMPLATE", "get_template"]


@dataclass(frozen=True)
class PromptTemplate:
    """A named format string with a single ``{q}`` slot for the question."""

    name: str
    pattern: str

    def __post_init__(self) -> None:
        if self.pattern.count("{q}") != 1:
            raise ValueError(f"template {self.name!r} must contain exactly one {{q}}")

    def format(self, question: str) -> str:
        # str.replace, not str.format: questions may contain braces (\boxed{}, JSON).
        return self.pattern.replace("{q}", question)


TEMPLATES: dict[str, PromptTemplate] = {
    t.name: t
    for t in (
        PromptTemplate("plain", "Question: {q}\nAnswer:\n"),
        PromptTemplate("qwen_chat", "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"),
    )
}
DEFAULT_TEMPLATE = "plain"


def get_template(name: str) -> PromptTemplate:
    """Look up a template by name; unknown names list the valid ones."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown prompt template {name!r}; valid: {sorted(TEMPLATES)}") from None
