r"""The exact solver of the synthetic stories: the inverse of `generate_v2_problem` on its closed vocabulary.

Why: DA-GRPO's embedded "cloud" (``solver:`` URLs, `slime_ext.engine.solver`) must answer the task the local
model trains on, and task family v2 tells ``*`` and ``/`` in phrases v1's solver does not know. v2's vocabulary
holds v1's (the same start and question sentences and connectors, v1's phrases for ``+ - *``), and the solution
line written here, the first of `STEP_TEMPLATES`, is v1's step line, so a v1 story read here gets v1's
reference byte for byte (`slime_ext.tasks.synthetic_math.solve_story` dispatches, and falls back to v1's own
reader on text this one refuses).

The reader is strict: from the last start sentence in the text it reads the generator's grammar and nothing
else: the start, one sentence per operation (the capitalised pronoun, then a connector and the pronoun, then
one story phrase and a full stop), the question about the same person and objects. A division must be exact.
All patterns are built from the tables (`Vocabulary`, by default `story_vocab` and `STORY_PHRASES`), and
`Vocabulary` refuses tables a story could be read from two ways (checked when the reader is built).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Optional

from slime_ext.tasks.story_vocab import CONNECTORS, OBJECTS, PEOPLE, QUESTION_TEMPLATES, START_TEMPLATES, cap
from slime_ext.tasks.v2.phrasing import STEP_TEMPLATES, STORY_PHRASES, apply_op, render_step

__all__ = ["Vocabulary", "DEFAULT_VOCABULARY", "SOLUTION_TEMPLATE_INDEX", "Step", "Story", "read_story", "solve_v2_story"]

# The step template the solver writes: every operation's first, the shared "Step k: Who phrase, so a op b = c."
# (v1's step line; a test keeps it so).
SOLUTION_TEMPLATE_INDEX = 0
_NUMBER = r"\d+"
_SAMPLE_OPERAND = 37  # to render each phrase once and read it back (the unambiguity check)


@dataclass(frozen=True)
class Vocabulary:
    """The tables stories are written from: (name, pronoun) pairs, objects, the start and question templates
    (fields {name} {n} {obj}), the phrases per operation ({b}: the operand) and the connectors."""

    people: tuple[tuple[str, str], ...] = PEOPLE
    objects: tuple[str, ...] = OBJECTS
    starts: tuple[str, ...] = START_TEMPLATES
    phrases: tuple[tuple[str, tuple[str, ...]], ...] = tuple(STORY_PHRASES.items())
    connectors: tuple[str, ...] = CONNECTORS
    questions: tuple[str, ...] = QUESTION_TEMPLATES


DEFAULT_VOCABULARY = Vocabulary()


def _alternatives(items: list[str] | tuple[str, ...]) -> str:
    """A regex alternation of literal strings, longest first (a string that is a prefix of another never wins
    where the longer one fits)."""
    return "(?:" + "|".join(re.escape(s) for s in sorted(set(items), key=len, reverse=True)) + ")"


def _fill(template: str, fields: dict[str, str], named: bool = True) -> str:
    """`template` as a regex: literal text escaped, each {field} its regex, as a named group (a field that
    repeats must repeat its value) or, with `named` False, an unnamed one (to sit in an alternation)."""
    out, seen, pos = [], set(), 0
    for m in re.finditer(r"\{(\w+)\}", template):
        name = m.group(1)
        out.append(re.escape(template[pos:m.start()]))
        if not named:
            out.append(f"(?:{fields[name]})")
        else:
            out.append(f"(?P={name})" if name in seen else f"(?P<{name}>{fields[name]})")
        seen.add(name)
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return "".join(out)


@dataclass(frozen=True)
class Step:
    """One operation read from a story: its phrase as written, the operation and the operand."""

    phrase: str
    op: str
    b: int


@dataclass(frozen=True)
class Story:
    """A story read back: who, which objects, the start value, the operations in order."""

    name: str
    pron: str
    obj: str
    start: int
    steps: tuple[Step, ...]


class _Reader:
    """The compiled patterns of one `Vocabulary`."""

    def __init__(self, vocab: Vocabulary):
        _check_vocabulary(vocab)
        self.pronoun = dict(vocab.people)
        names, objs = _alternatives([n for n, _ in vocab.people]), _alternatives(vocab.objects)
        head = {"name": names, "n": _NUMBER, "obj": objs}
        # a name starts a word: "Mia has ..." is not read inside "XMia has ..."
        self.starts = [re.compile(r"(?<!\w)" + _fill(t, head)) for t in vocab.starts]
        self.questions = [re.compile(r"\s+" + _fill(t, head)) for t in vocab.questions]
        self.phrase_forms = [(op, re.compile(_fill(p, {"b": _NUMBER}))) for op, ps in vocab.phrases for p in ps]
        phrases = sorted((_fill(p, {"b": _NUMBER}, named=False) for _, ps in vocab.phrases for p in ps),
                         key=len, reverse=True)
        phrase = "(?P<phrase>" + "|".join(phrases) + ")"
        connectors = _alternatives(vocab.connectors)
        self.first: dict[str, re.Pattern] = {}
        self.later: dict[str, re.Pattern] = {}
        for pron in set(self.pronoun.values()):
            self.first[pron] = re.compile(rf"\s+{re.escape(cap(pron))} {phrase}\.")
            self.later[pron] = re.compile(rf"\s+{connectors} {re.escape(pron)} {phrase}\.")

    def step(self, phrase: str) -> Optional[Step]:
        """The operation and operand of a phrase: the one phrase template it is written from, else None."""
        found = [(op, m) for op, form in self.phrase_forms if (m := form.fullmatch(phrase)) is not None]
        if len(found) != 1:
            return None
        op, m = found[0]
        return Step(phrase, op, int(m.group("b")))

    def read(self, text: str) -> Optional[Story]:
        """The last story of `text` (see the module docstring), or None."""
        starts = [m for regex in self.starts for m in regex.finditer(text)]
        if not starts:
            return None
        last = max(m.start() for m in starts)
        # a start template that is a prefix of another may match at the same place: try the longest first
        for start in sorted((m for m in starts if m.start() == last), key=lambda m: m.end(), reverse=True):
            story = self._read_from(text, start)
            if story is not None:
                return story
        return None

    def _read_from(self, text: str, start: re.Match) -> Optional[Story]:
        name, obj = start.group("name"), start.group("obj")
        pron = self.pronoun[name]
        steps: list[Step] = []
        pos = start.end()
        while (m := (self.later if steps else self.first)[pron].match(text, pos)) is not None:
            step = self.step(m.group("phrase"))
            if step is None:
                return None
            steps.append(step)
            pos = m.end()
        if not steps:
            return None
        for regex in self.questions:
            q = regex.match(text, pos)
            if q is not None and q.group("name") == name and q.group("obj") == obj:
                return Story(name, pron, obj, int(start.group("n")), tuple(steps))
        return None


def _check_vocabulary(vocab: Vocabulary) -> None:
    """Refuse tables whose stories could be read two ways: a name given two pronouns, a phrase without exactly
    one operand or with a full stop (it would end its sentence early), or a phrase that reads back as another
    template's (e.g. the same phrase under two operations)."""
    names = [n for n, _ in vocab.people]
    if len(set(names)) != len(names):
        raise ValueError("a name appears twice in the people table")
    phrases = [(op, p) for op, ps in vocab.phrases for p in ps]
    for op, p in phrases:
        if p.count("{b}") != 1 or re.findall(r"\{(\w+)\}", p) != ["b"] or "." in p:
            raise ValueError(f"phrase {p!r} ({op}) must hold one {{b}}, no other field and no full stop")
    forms = [(op, re.compile(_fill(p, {"b": _NUMBER}))) for op, p in phrases]
    for op, p in phrases:
        text = p.format(b=_SAMPLE_OPERAND)
        readings = [(o, int(m.group("b"))) for o, form in forms if (m := form.fullmatch(text)) is not None]
        if readings != [(op, _SAMPLE_OPERAND)]:
            raise ValueError(f"phrase {p!r} ({op}) reads back as {readings}: the phrase tables are ambiguous")


@functools.lru_cache(maxsize=8)
def _reader(vocab: Vocabulary) -> _Reader:
    return _Reader(vocab)


def read_story(text: str, vocab: Vocabulary = DEFAULT_VOCABULARY) -> Optional[Story]:
    """The last story in `text`, read in the generator's grammar over `vocab`; None when there is none."""
    return _reader(vocab).read(text)


def solve_v2_story(text: str, vocab: Vocabulary = DEFAULT_VOCABULARY) -> Optional[str]:
    r"""The solution of the last story in `text`: one ``Step k: Who phrase, so a op b = c.`` line per operation,
    then ``\boxed{N}``. None when no story is read or a division is not exact (no generated story has one)."""
    story = read_story(text, vocab)
    if story is None:
        return None
    lines, value = [], story.start
    for k, s in enumerate(story.steps, 1):
        try:
            new_value = apply_op(value, s.op, s.b)
        except ValueError:
            return None
        lines.append(render_step(STEP_TEMPLATES[s.op][SOLUTION_TEMPLATE_INDEX], k=k, who=story.name if k == 1 else story.pron,
                                 pron=story.pron, phrase=s.phrase, obj=story.obj, a=value, op=s.op, b=s.b, c=new_value))
        value = new_value
    return "\n".join([*lines, f"\\boxed{{{value}}}"])
