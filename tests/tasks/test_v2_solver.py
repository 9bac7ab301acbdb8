r"""The exact solver on task family v2 (`slime_ext.tasks.v2.solver`) and the one dispatch for both families
(`solve_story`, behind DA-GRPO's `solver:` cloud): every level V2-V10, train and eval, re-check shares 0 and 1,
bare, in the chat template and after a v1 story; v1 stories answered byte for byte as before; refusals; tables
a story could be read from two ways."""

from __future__ import annotations

import pytest

from slime_ext.engine.solver import SOLVERS, SolverEngine
from slime_ext.rewards import get_verifier
from slime_ext.tasks import synthetic_math as sm
from slime_ext.tasks.synthetic_math import LEVELS, TOOL_LEVELS, generate_dataset, solve_story
from slime_ext.tasks.templates import get_template
from slime_ext.tasks.v2.levels import V2_LEVELS
from slime_ext.tasks.v2.phrasing import STEP_TEMPLATES, apply_op, parse_step
from slime_ext.tasks.v2.recheck import split_tail
from slime_ext.tasks.v2.solver import SOLUTION_TEMPLATE_INDEX, Vocabulary, read_story, solve_v2_story

N = 300
verify = get_verifier("math")
CHAT, PLAIN = get_template("qwen_chat"), get_template("plain")


def equations(solution: str) -> list[tuple[int, str, int, int]]:
    """(a, op, b, c) of every step line of a solution (its tail cut), in order; fails on a line no step template
    explains or on a step number out of order."""
    body, _ = split_tail(solution)
    lines = [line for line in body.split("\n") if line]
    steps = [parse_step(line) for line in lines[:-1]]
    assert None not in steps, lines
    assert [s.k for s in steps] == list(range(1, len(steps) + 1)), lines
    return [(s.a, s.op, s.b, s.c) for s in steps]


def check_answer(row: dict, answer: str | None) -> None:
    """The solver's answer to `row`: exactly num_steps right equations, chained from the story's start value,
    the same arithmetic as the reference, in the solver's template, then the label boxed (and scored 1)."""
    assert answer is not None, row["id"]
    lines = answer.split("\n")
    assert lines[-1] == f"\\boxed{{{row['label']}}}", (row["id"], answer)
    assert verify(answer, row["label"]).score == 1.0
    steps = [parse_step(line) for line in lines[:-1]]
    assert None not in steps and {s.template for s in steps} == {SOLUTION_TEMPLATE_INDEX}, answer
    eqs = equations(answer)
    assert len(eqs) == row["num_steps"]
    assert all(apply_op(a, op, b) == c for a, op, b, c in eqs)
    assert all(eqs[i][3] == eqs[i + 1][0] for i in range(len(eqs) - 1)) and str(eqs[-1][3]) == row["label"]
    assert eqs == equations(row["solution"]), row["id"]  # the reference's arithmetic, step for step


@pytest.fixture(scope="module")
def v1_context() -> str:
    """A v1 problem and its solution, as a one-shot example before the question."""
    row = generate_dataset("L4", 1, seed=5, split="eval")[0]
    return PLAIN.format(row["prompt"]) + row["solution"] + "\n\n"


@pytest.mark.parametrize("level", list(V2_LEVELS))
def test_the_solver_answers_every_v2_level(level, v1_context):
    for split in ("train", "eval"):
        for share in (0.0, 1.0):
            rows = generate_dataset(level, N, seed=0, split=split, recheck_share=share)
            assert len(rows) == N and sum(r["recheck"] for r in rows) == (N if share else 0)
            for row in rows:
                answer = solve_story(row["prompt"])
                check_answer(row, answer)
                assert solve_v2_story(row["prompt"]) == answer  # the dispatch takes the v2 reader
                assert solve_story(CHAT.format(row["prompt"])) == answer
                assert solve_story(v1_context + CHAT.format(row["prompt"])) == answer


@pytest.mark.parametrize("level", [*LEVELS, *TOOL_LEVELS])
def test_v1_stories_are_answered_byte_for_byte_as_before(level):
    """The strict reader covers every generated v1 story and writes v1's reference; the dispatch and v1's own
    reader agree, bare and in both templates."""
    for row in generate_dataset(level, 200, seed=3, split="eval"):
        assert solve_v2_story(row["prompt"]) == row["solution"], row["id"]
        for text in (row["prompt"], PLAIN.format(row["prompt"]), CHAT.format(row["prompt"])):
            assert solve_story(text) == sm._solve_v1_story(text) == row["solution"], row["id"]


def test_the_solution_template_is_v1s_step_line():
    for op in ("+", "-", "*", "/"):
        assert STEP_TEMPLATES[op][SOLUTION_TEMPLATE_INDEX] == "Step {k}: {Who} {phrase}, so {a} {op} {b} = {c}."


def test_the_last_story_is_answered():
    v2a, v2b = generate_dataset("V7", 2, seed=1, split="eval", recheck_share=1.0)
    v1 = generate_dataset("L3", 1, seed=1, split="eval")[0]
    assert solve_story(f"{v2a['prompt']}\n{v2b['prompt']}") == solve_story(v2b["prompt"]) != solve_story(v2a["prompt"])
    assert solve_story(CHAT.format(v2a["prompt"]) + "\n" + CHAT.format(v1["prompt"])) == v1["solution"]
    # a story after the answer of another (a follow-up question) is the one answered
    assert read_story(v2a["prompt"] + "\n" + v2a["solution"] + "\n" + v2b["prompt"]).start == read_story(v2b["prompt"]).start


@pytest.mark.parametrize("text", [
    "",
    "What is the capital of France?",
    "Mia has 5 apples. How many apples does Mia have now?",  # no operation
    "Mia has 5 apples. She finds 2 more.",  # no question
    "XMia has 5 apples. She finds 2 more. How many apples does Mia have now?",  # a name inside a word
    "Mia has 5 apples. He finds 2 more. How many apples does Mia have now?",  # not her pronoun
    "Mia has 5 apples. She finds 2 more. How many apples does Liam have now?",  # another person
    "Mia has 5 apples. She finds 2 more. How many coins does Mia have now?",  # other objects
    "Mia has 5 apples. She finds 2 more. She loses 1. How many apples does Mia have now?",  # no connector
    "Mia has 5 apples. She sings 2 songs. How many apples does Mia have now?",  # not a story phrase
    "Mia has 7 apples. She keeps only one of 2 equal shares. How many apples does Mia have now?",  # 7 / 2
])
def test_the_v2_reader_refuses_what_the_generator_cannot_write(text):
    assert solve_v2_story(text) is None


def test_refused_text_goes_to_v1s_reader_as_before():
    assert solve_story("What is the capital of France?") is None
    inexact = "Mia has 7 apples. She keeps only one of 2 equal shares. How many apples does Mia have now?"
    assert solve_story(inexact) is None  # v1 knows no phrase in it
    lenient = "Mia has 5 apples. She finds 2 more."  # v1's reader does not need the question
    assert solve_story(lenient) == sm._solve_v1_story(lenient) == "Step 1: Mia finds 2 more, so 5 + 2 = 7.\n\\boxed{7}"


def test_the_cloud_solvers_answer_a_v2_prompt():
    from sglang_patches.decoding import SamplingParams
    from slime_ext.data.generation import GenerateRequest

    row = next(r for r in generate_dataset("V9", 20, seed=2, split="eval", recheck_share=1.0) if "/" in r["solution"])
    text = CHAT.format(row["prompt"])
    assert SOLVERS["synthetic_math_answer"](text) == f"\\boxed{{{row['label']}}}"
    assert SOLVERS["synthetic_math"](text) == solve_story(row["prompt"])
    engine = SolverEngine("synthetic_math_answer")
    (out,) = engine.generate([GenerateRequest("a", engine.tokenizer(text)["input_ids"], SamplingParams(), 0)])
    assert engine.tokenizer.decode(out.output_ids) == f"\\boxed{{{row['label']}}}"


# -- tables a story could be read from two ways ------------------------------------------------------------
TRICKY = Vocabulary(
    people=(("R2D2", "it"), ("Ann", "she"), ("MaryAnn", "he")),
    objects=("bolts", "bolts of cloth"),
    starts=("{name} has {n} {obj}.",),
    phrases=(("+", ("finds {b}", "finds {b} more", "gets {b} more from 3 friends")),
             ("-", ("finds {b} fewer", "loses {b}")),
             ("*", ("ends up with {b} times as many",)),
             ("/", ("keeps one of {b} equal parts",))),
    connectors=("Then", "Then,"),
    questions=("How many {obj} does {name} have now?",),
)


@pytest.mark.parametrize("text, expected", [
    # a phrase that is a prefix of others; digits in a name and in a phrase (the operand is the {b} slot)
    ("R2D2 has 12 bolts. It finds 3 more. Then it gets 5 more from 3 friends. Then, it finds 4 fewer. "
     "Then it finds 6. How many bolts does R2D2 have now?", (12, [("+", 3), ("+", 5), ("-", 4), ("+", 6)])),
    # an object that is a prefix of another; a name inside another name is not a start
    ("MaryAnn has 20 bolts of cloth. He keeps one of 4 equal parts. Then he ends up with 3 times as many. "
     "How many bolts of cloth does MaryAnn have now?", (20, [("/", 4), ("*", 3)])),
])
def test_ambiguous_tables_read_each_story_one_way(text, expected):
    story = read_story(text, TRICKY)
    assert story is not None and (story.start, [(s.op, s.b) for s in story.steps]) == expected
    answer = solve_v2_story(text, TRICKY)
    value = expected[0]
    for op, b in expected[1]:
        value = apply_op(value, op, b)
    assert answer is not None and answer.endswith(f"\\boxed{{{value}}}")
    assert read_story("Ann" + text[text.index(" has"):], TRICKY) is None  # a story of Ann needs her pronoun


@pytest.mark.parametrize("change, message", [
    ({"phrases": (("+", ("finds {b}",)), ("-", ("finds {b}",)))}, "ambiguous"),
    ({"phrases": (("+", ("finds {b}. Really",)),)}, "full stop"),
    ({"phrases": (("+", ("finds {b} and {b}",)),)}, "one {b}"),
    ({"people": (("Mia", "she"), ("Mia", "he"))}, "appears twice"),
])
def test_tables_a_story_could_be_read_from_two_ways_are_refused(change, message):
    vocab = Vocabulary(**{**TRICKY.__dict__, **change})
    with pytest.raises(ValueError, match=message):
        read_story("anything", vocab)
