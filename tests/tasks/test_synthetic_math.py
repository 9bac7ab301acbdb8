"""Synthetic math task: determinism, exact arithmetic, split hygiene, difficulty ordering."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from slime_ext.tasks import synthetic_math as sm
from slime_ext.tasks.dataset import load_jsonl
from slime_ext.tasks.synthetic_math import (
    DEFAULT_LEVEL,
    LEVELS,
    MathLevel,
    generate_dataset,
    main,
    write_jsonl,
)

STEP_RE = re.compile(r"^Step (\d+): .*, so (\d+) ([+\-*]) (\d+) = (\d+)\.$")
BOXED_RE = re.compile(r"^\\boxed\{(\d+)\}$")


def parse_solution(solution: str) -> tuple[list[tuple[int, str, int, int]], int]:
    """[(a, op, b, c), ...] and the boxed value; fails the test on any malformed line."""
    lines = solution.split("\n")
    steps = []
    for k, line in enumerate(lines[:-1], start=1):
        m = STEP_RE.match(line)
        assert m, f"malformed step line: {line!r}"
        assert int(m.group(1)) == k, f"step numbering off in {solution!r}"
        steps.append((int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5))))
    m = BOXED_RE.match(lines[-1])
    assert m, f"last line is not \\boxed{{N}}: {lines[-1]!r}"
    return steps, int(m.group(1))


def apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def test_level_table_shape() -> None:
    assert list(LEVELS) == ["L0", "L1", "L2", "L3", "L4", "L5"]
    assert DEFAULT_LEVEL == "L2"
    l2 = LEVELS["L2"]
    assert (l2.min_ops, l2.max_ops, l2.operand_min, l2.operand_max, set(l2.ops)) == (2, 3, 1, 49, {"+", "-"})


def test_same_args_identical_rows_and_seed_changes_them() -> None:
    a = generate_dataset(["L2", "L4"], 60, seed=3, split="train")
    b = generate_dataset(["L2", "L4"], 60, seed=3, split="train")
    assert a == b
    c = generate_dataset(["L2", "L4"], 60, seed=4, split="train")
    assert [r["prompt"] for r in a] != [r["prompt"] for r in c]
    # Most prompts differ, not just one.
    assert len({r["prompt"] for r in a} & {r["prompt"] for r in c}) < 5


def test_generation_ignores_global_rng() -> None:
    import random

    random.seed(1)
    a = generate_dataset("L3", 20, seed=0, split="train")
    random.seed(2)
    random.random()
    b = generate_dataset("L3", 20, seed=0, split="train")
    assert a == b


def test_rows_have_expected_schema_and_ids() -> None:
    rows = generate_dataset(["L0", "L2"], 6, seed=0, split="eval")
    assert [r["level"] for r in rows] == ["L0", "L2"] * 3  # round-robin interleave
    assert [r["id"] for r in rows[:4]] == ["L0-eval-0", "L2-eval-0", "L0-eval-1", "L2-eval-1"]
    for r in rows:
        assert set(r) == {"id", "prompt", "label", "solution", "level", "num_steps", "task"}
        assert r["task"] == "math" and isinstance(r["label"], str)


def test_shorter_request_is_prefix_of_longer() -> None:
    assert generate_dataset("L1", 40, 0, "eval") == generate_dataset("L1", 100, 0, "eval")[:40]


@pytest.mark.parametrize("level_name", list(LEVELS))
def test_solution_arithmetic_and_story_consistency(level_name: str) -> None:
    level = LEVELS[level_name]
    rows = generate_dataset(level_name, 500, seed=11, split="train")
    ops_seen: set[str] = set()
    for r in rows:
        steps, boxed = parse_solution(r["solution"])
        assert level.min_ops <= len(steps) == r["num_steps"] <= level.max_ops
        for (a, op, b, c) in steps:
            assert apply(a, op, b) == c, f"wrong arithmetic {a} {op} {b} = {c} in {r['id']}"
            assert c >= 0, f"negative intermediate in {r['id']}"
            if level.max_value is not None:
                assert c <= level.max_value
            assert op in level.ops
            if op == "*":
                assert level.mult_min <= b <= level.mult_max
            else:
                assert level.operand_min <= b <= level.operand_max
            ops_seen.add(op)
        for (_, _, _, c), (a_next, _, _, _) in zip(steps, steps[1:]):
            assert a_next == c, f"steps do not chain in {r['id']}"
        assert steps[-1][3] == boxed == int(r["label"])
        # The story states exactly the start value and the operands, in order.
        start = steps[0][0]
        assert level.operand_min <= start <= max(2, level.operand_max)
        assert [int(x) for x in re.findall(r"\d+", r["prompt"])] == [start] + [s[2] for s in steps]
    assert ops_seen == set(level.ops), f"{level_name} never used some ops: {ops_seen}"


def test_l2_default_level_constraints() -> None:
    rows = generate_dataset(DEFAULT_LEVEL, 1000, seed=0, split="train")
    n_steps = {r["num_steps"] for r in rows}
    assert n_steps == {2, 3}
    ops = set()
    for r in rows:
        steps, _ = parse_solution(r["solution"])
        assert 1 <= steps[0][0] <= 49
        for a, op, b, c in steps:
            ops.add(op)
            assert 1 <= b <= 49
            assert a >= 0 and c >= 0
    assert ops == {"+", "-"}


def test_subtraction_switches_when_value_too_small() -> None:
    # Start values are small and subtraction is drawn half the time; running values
    # near 0 must force "+" rather than going negative.
    tiny = MathLevel("T", 5, 5, 1, 3, ("+", "-"))
    import random

    for i in range(300):
        r = sm.generate_problem(random.Random(i), tiny, i)
        steps, _ = parse_solution(r["solution"])
        assert all(c >= 0 for (_, _, _, c) in steps)


def test_mean_solution_length_strictly_increases_with_level() -> None:
    means = [
        statistics.mean(len(r["solution"]) for r in generate_dataset(name, 1000, seed=0, split="train"))
        for name in LEVELS
    ]
    assert all(a < b for a, b in zip(means, means[1:])), means


@pytest.mark.parametrize("level_name", ["L0", "L2"])
def test_train_and_eval_share_no_prompt(level_name: str) -> None:
    eval_rows = generate_dataset(level_name, 2000, seed=0, split="eval")
    train_rows = generate_dataset(level_name, 4000, seed=0, split="train")
    eval_prompts = {r["prompt"] for r in eval_rows}
    train_prompts = [r["prompt"] for r in train_rows]
    assert len(set(train_prompts)) == len(train_prompts), "duplicate prompts within train"
    assert len(eval_prompts) == len(eval_rows), "duplicate prompts within eval"
    assert not eval_prompts & set(train_prompts)


def test_disjointness_is_enforced_not_lucky() -> None:
    # Without the exclusion, the small L0 space does collide with eval: the test above
    # is therefore meaningful.
    level = LEVELS["L0"]
    eval_prompts = {r["prompt"] for r in generate_dataset("L0", 2000, seed=0, split="eval")}
    raw_train = sm._level_stream(level, 0, "train", 4000, frozenset())
    assert len(eval_prompts & {r["prompt"] for r in raw_train}) > 0


def test_heldout_request_beyond_reserve_is_refused() -> None:
    with pytest.raises(ValueError, match="heldout_reserve"):
        generate_dataset("L2", 30, seed=0, split="eval", heldout_reserve=20)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown level"):
        generate_dataset("L9", 5, 0, "train")
    with pytest.raises(ValueError, match="n must be"):
        generate_dataset("L2", -1, 0, "train")
    with pytest.raises(ValueError):
        MathLevel("bad", 3, 2, 1, 9, ("+",))
    with pytest.raises(ValueError):
        MathLevel("bad", 1, 2, 1, 9, ("-", "*"))
    assert generate_dataset("L2", 0, 0, "train") == []


def test_write_jsonl_is_atomic_and_overwrites(tmp_path) -> None:
    out = tmp_path / "sub" / "data.jsonl"
    rows = generate_dataset("L1", 5, 0, "train")
    write_jsonl(rows, out)
    write_jsonl(rows[:2], out)
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows[:2]
    assert sorted(p.name for p in out.parent.iterdir()) == ["data.jsonl"]  # no temp left behind


def test_cli_writes_loadable_jsonl(tmp_path, capsys) -> None:
    out = tmp_path / "train.jsonl"
    assert main(["--level", "L2", "--n", "50", "--seed", "0", "--split", "train", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows == generate_dataset("L2", 50, 0, "train")
    loaded, report = load_jsonl(out)
    assert report.n_rows_ok == 50 and report.n_skipped == 0
    assert loaded[0]["row_id"] == "L2-train-0" and loaded[0]["solution"] == rows[0]["solution"]
    assert "wrote 50 rows" in capsys.readouterr().err


@pytest.mark.parametrize("level", list(LEVELS))
def test_solve_story_reproduces_the_reference_solution_inside_a_chat_prompt(level):
    rows = generate_dataset([level], 200, seed=3, split="eval")
    for row in rows:
        assert sm.solve_story(f"Question: {row['prompt']}\nAnswer:") == row["solution"], row["id"]


def test_solve_story_refuses_text_without_a_story():
    assert sm.solve_story("What is the capital of France?") is None
    assert sm.solve_story("Mia has 5 apples. How many apples does Mia have now?") is None  # no operation
