"""The closed vocabulary of the synthetic math stories: people, objects, story phrases.

Why a module of its own: the tokenizer is trained on this text, so the task families (v1 in
`synthetic_math`, v2 in `slime_ext.tasks.v2`) share one small word list instead of each growing its own.
Changing any entry changes every generated row of the families that use it (v1's rows are pinned by hashes
in tests/tasks/test_task_v2.py).
"""

from __future__ import annotations

__all__ = ["PEOPLE", "OBJECTS", "START_TEMPLATES", "OP_PHRASES", "CONNECTORS", "QUESTION_TEMPLATES", "cap"]

# (name, subject pronoun). Small on purpose: the tokenizer is trained on this text.
PEOPLE: tuple[tuple[str, str], ...] = (
    ("Mia", "she"), ("Liam", "he"), ("Emma", "she"), ("Noah", "he"),
    ("Ava", "she"), ("Leo", "he"), ("Zoe", "she"), ("Sam", "he"),
    ("Nina", "she"), ("Omar", "he"), ("Lily", "she"), ("Ben", "he"),
)
OBJECTS: tuple[str, ...] = (
    "apples", "marbles", "stickers", "coins", "books", "pencils",
    "cookies", "stamps", "shells", "cards", "balloons", "candies",
)
START_TEMPLATES: tuple[str, ...] = (
    "{name} has {n} {obj}.",
    "{name} starts with {n} {obj}.",
    "{name} owns {n} {obj}.",
    "{name} keeps {n} {obj} in a box.",
)
# Verb phrases per operation; {b} is the operand. Used verbatim in the story and
# in the solution step, so the model can copy the operation it has to perform.
OP_PHRASES: dict[str, tuple[str, ...]] = {
    "+": (
        "finds {b} more",
        "buys {b} more",
        "gets {b} more from a friend",
        "wins {b} more",
        "picks up {b} more",
    ),
    "-": (
        "gives {b} to a friend",
        "loses {b}",
        "sells {b}",
        "uses {b}",
        "gives away {b}",
    ),
    "*": (
        "ends up with {b} times as many",
        "makes the pile {b} times as big",
        "trades them for {b} times as many",
    ),
}
CONNECTORS: tuple[str, ...] = ("Then", "Next,", "After that,", "Later,")
QUESTION_TEMPLATES: tuple[str, ...] = (
    "How many {obj} does {name} have now?",
    "How many {obj} does {name} have in the end?",
    "How many {obj} does {name} have at the end?",
)


def cap(s: str) -> str:
    """`s` with its first character upper-cased (a pronoun that starts a sentence)."""
    return s[:1].upper() + s[1:]
