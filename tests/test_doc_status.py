"""No progress-status wording in docs/: a page says what was measured, not what is under way.

Why: status lines ("(started)", "seeds 1-2 to run", "being rerun") go stale the day the work finishes, and the
pages then claim work that is long done is still open (issue 71, item 4). The words also have ordinary uses
("the job started", "it would have to run", "warm-started"), so the rule matches the status phrasings only:
any of the words in a heading or in parentheses, "in progress" and "being rerun" anywhere, "has / have started",
and "to run" after "still / yet / left / remains" or a list of seeds. Text is matched with its line breaks
folded, so a phrase wrapped over two lines is caught."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

WORDS = r"(?:started|to run|being re-?run|in progress)"
STATUS = [re.compile(p, re.IGNORECASE) for p in (
    rf"\(\s*{WORDS}\s*\)",                                   # "## The v2 study (started)"
    r"\bin progress\b",
    r"\bbeing re-?run\b",
    r"\b(?:has|have) (?:now |just )?started\b",              # "a re-run ... has started"
    r"\b(?:still|yet|left|remains?|remaining) to run\b",
    r"\bseeds? \d+(?:\s*(?:-|–|,|and)\s*\d+)* (?:still )?to run\b",  # "seeds 1-2 to run"
)]
HEADING_WORDS = re.compile(rf"\b{WORDS}\b", re.IGNORECASE)
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)  # code blocks: shell comments are not headings


def status_phrases(text: str) -> list[str]:
    """The status phrases in one markdown page (outside code blocks), each with a little context."""
    text = FENCED.sub("", text)
    found = [line.strip() for line in text.splitlines() if line.startswith("#") and HEADING_WORDS.search(line)]
    flat = re.sub(r"\s+", " ", text)
    for pattern in STATUS:
        found += [flat[max(0, m.start() - 40): m.end() + 10] for m in pattern.finditer(flat)]
    return found


@pytest.mark.parametrize("old", [
    "## The v2 study (started)",
    "A re-run on task family v2 has started (issue 30, item 3): seed 0 is complete",
    "The study is being rerun at 80-step phases (seed 0's five arms, then seeds 1-2)",
    "DA-GRPO has seed 0 at 40-step phases and is being\nrerun at 80-step phases",
    "a fixed assistance reward tuned to its cloud rate (seed 0 complete, seeds 1-2 to run) |",
    "seeds 1 and 2\n  to run",
    "the SxS study (in progress)",
    "## Seed 3 in progress",
])
def test_the_old_status_lines_are_caught(old):
    assert status_phrases(old), old


@pytest.mark.parametrize("ordinary", [
    "after ending every Ray actor and process the job started (tested with SIGINT)",
    "started every run from mean@4 61.1 (SE 2.1)",
    "with lambda by bisection on log lambda, warm-started from the previous step",
    "`solver:` endpoints are started by the orchestration",
    "an `assert` nested in a `def` is refused: it would have\nto run the code",
    "put it after any method's config to run that method on v2",
    "`--skip-eval` to run only the ask measurement",
    "a restarted engine loads the base checkpoint",
    "```bash\n# every worker node, started first or within WAIT_FOR_NODES_S of the head:\n```",
])
def test_ordinary_uses_pass(ordinary):
    assert status_phrases(ordinary) == []


def test_docs_carry_no_status_lines():
    bad = {str(p.relative_to(REPO)): found for p in sorted((REPO / "docs").rglob("*.md"))
           if (found := status_phrases(p.read_text()))}
    assert not bad, "status wording in docs/ (say what was measured instead):\n" + "\n".join(
        f"{page}: ...{phrase}..." for page, phrases in bad.items() for phrase in phrases)
