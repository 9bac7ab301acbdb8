"""The tools task's levels (T1, T2) and their tool-call reference solutions (slime_ext/tasks/tool_solutions.py)."""

from __future__ import annotations

import json

import pytest

from slime_ext.config.sections import DataConfig, SyntheticDataConfig
from slime_ext.tasks.prepare import prepare_data
from slime_ext.tasks.synthetic_math import ALL_LEVELS, LEVELS, TOOL_LEVELS, generate_dataset
from slime_ext.tasks.tool_solutions import expression, tool_solution, with_tool_solution


@pytest.mark.parametrize("level", list(TOOL_LEVELS))
def test_tool_levels_are_deterministic_recorded_and_need_long_arithmetic(level):
    rows = generate_dataset([level], 300, seed=0, split="train")
    assert rows == generate_dataset([level], 300, seed=0, split="train")
    assert rows != generate_dataset([level], 300, seed=1, split="train")
    assert {r["level"] for r in rows} == {level}
    # every problem has a number of 3+ digits, and most answers have 4+ digits (T1: 71%, T2: all but a few)
    assert all(any(len(tok) >= 3 for tok in r["prompt"].replace(".", " ").split() if tok.isdigit()) for r in rows)
    assert sum(len(r["label"]) >= 4 for r in rows) / len(rows) > 0.6
    assert sum("times" in r["prompt"] for r in rows) / len(rows) > 0.4  # two-digit factors are common


def test_tool_levels_stay_out_of_the_curriculum():
    assert list(LEVELS) == ["L0", "L1", "L2", "L3", "L4", "L5"]
    assert list(ALL_LEVELS)[:8] == [*LEVELS, "T1", "T2"]  # then task family v2's V2-V10 (test_task_v2.py)


@pytest.mark.parametrize("level", list(TOOL_LEVELS))
def test_the_expression_computes_the_steps_and_the_label(level):
    for row in generate_dataset([level], 300, seed=2, split="eval"):
        expr, value = expression(row["solution"])
        assert str(value) == row["label"]
        assert eval(expr, {"__builtins__": {}}) == value  # the brackets give the story's order  # noqa: S307
        assert "()" not in expr and expr.count("(") == expr.count(")")


def test_brackets_only_where_a_product_follows_a_sum():
    steps = "Step 1: Mia finds 5 more, so 10 + 5 = 15.\nStep 2: She ends up with 12 times as many, so 15 * 12 = 180.\n"
    assert expression(steps + "\\boxed{180}") == ("(10+5)*12", 180)
    steps = "Step 1: Mia ends up with 12 times as many, so 10 * 12 = 120.\nStep 2: She loses 5, so 120 - 5 = 115.\n"
    assert expression(steps + "\\boxed{115}") == ("10*12-5", 115)
    with pytest.raises(ValueError, match="wrong"):
        expression("Step 1: Mia finds 5 more, so 10 + 5 = 16.\n\\boxed{16}")


def test_tool_solution_format():
    steps = "Step 1: Mia ends up with 12 times as many, so 10 * 12 = 120.\nStep 2: She loses 5, so 120 - 5 = 115.\n"
    solution = steps + "\\boxed{115}"
    assert tool_solution(solution, "calculator") == (
        "<tool>calculator</tool><input>10*12-5</input>\n<output>\n115\n</output>\n\\boxed{115}")
    assert tool_solution(solution, "python") == (
        "<tool>python</tool><input>print(10*12-5)</input>\n<output>\n115\n</output>\n\\boxed{115}")
    row = {"prompt": "p", "label": "115", "solution": solution, "level": "T1"}
    assert with_tool_solution(row, "calculator") == dict(row, solution=tool_solution(solution, "calculator"),
                                                         tool="calculator")


def test_prepared_tool_data_has_the_same_problems_as_the_step_data(tmp_path):
    syn = {"train_levels": ["T1", "T2"], "eval_levels": ["T1", "T2"], "n_train": 60, "n_eval": 20}
    steps = prepare_data(DataConfig(synthetic=syn), tmp_path)
    tools = prepare_data(DataConfig(synthetic=dict(syn, solution_tool="calculator")), tmp_path)
    assert tools.train_path != steps.train_path  # its own cache entry
    for a, b in ((steps.train, tools.train), (steps.eval, tools.eval)):
        assert [(r["prompt"], r["label"], r["level"]) for r in a] == [(r["prompt"], r["label"], r["level"]) for r in b]
        assert all(r["solution"].startswith("<tool>calculator</tool><input>") and r["tool"] == "calculator" for r in b)
        assert all(r["solution"] == tool_solution(s["solution"], "calculator") for s, r in zip(a, b))
    again = prepare_data(DataConfig(synthetic=dict(syn, solution_tool="calculator")), tmp_path)
    assert [json.dumps(r) for r in again.train] == [json.dumps(r) for r in tools.train]


def test_existing_caches_keep_their_keys():
    """Without a solution tool the data and warm-start keys hold exactly the fields they held before the key
    existed, so no cached data set or warm start of an existing config is rebuilt."""
    assert SyntheticDataConfig().cache_fields() == {"train_levels": ["L2"], "eval_levels": ["L2"], "n_train": 20000,
                                                    "n_eval": 512, "seed": 0, "step_separator": "\n"}
    assert SyntheticDataConfig(solution_tool="python").cache_fields()["solution_tool"] == "python"
    data = DataConfig()
    assert data.cache_fields() == dict(data.model_dump(), synthetic=data.synthetic.cache_fields())


def test_measured_reference_rows_take_the_tool_format(tmp_path):
    """The reference-length measurement rewrites rows as the data stage does: with a solution tool, one tool call
    per solution (it measured the step format before `rewrite_synthetic_rows` was shared)."""
    from types import SimpleNamespace

    from slime_ext.tasks.v2.measure import measured_rows

    syn = {"train_levels": ["T1", "T2"], "eval_levels": ["T1", "T2"], "n_train": 60, "n_eval": 20}
    steps = measured_rows(SimpleNamespace(data=DataConfig(synthetic=syn)), 5)
    tools = measured_rows(SimpleNamespace(data=DataConfig(synthetic=dict(syn, solution_tool="calculator"))), 5)
    assert len(tools) == 10 and [r["level"] for r in tools] == ["T1"] * 5 + ["T2"] * 5
    assert tools == [with_tool_solution(r, "calculator") for r in steps]
