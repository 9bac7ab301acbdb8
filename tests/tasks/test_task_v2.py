"""Task family v2 (issue 30 item 1): levels V2-V10 of exactly that many steps, phrasings, the re-check tail, the
verifier on every level, token lengths with the run's tokenizer, and v1's rows unchanged."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from slime_ext.orchestration.driver import _corrupt_final_answer
from slime_ext.rewards import get_verifier
from slime_ext.tasks.synthetic_math import ALL_LEVELS, LEVELS, TOOL_LEVELS, generate_dataset
from slime_ext.tasks.v2.generator import MIN_VALUE, choose_op
from slime_ext.tasks.v2.levels import V2_LEVELS, StepLevel
from slime_ext.tasks.v2.phrasing import STEP_TEMPLATES, STORY_PHRASES, apply_op, parse_step
from slime_ext.tasks.v2.recheck import RECHECK_MARKER, TAIL_TEMPLATES, split_tail

V2 = list(V2_LEVELS)
N_PER_LEVEL = 120
verify = get_verifier("math")


@pytest.fixture(scope="module")
def rows_by_level() -> dict[str, list[dict]]:
    """N_PER_LEVEL eval rows of every v2 level, half of them with a tail."""
    return {lvl: generate_dataset(lvl, N_PER_LEVEL, seed=0, split="eval", recheck_share=0.5) for lvl in V2}


def parse(solution: str) -> tuple[list, int, str | None]:
    """(parsed steps, boxed answer, tail or None); fails the test on a line no template explains."""
    body, tail = split_tail(solution)
    lines = body.split("\n")
    steps = [parse_step(line) for line in lines[:-1]]
    assert None not in steps, f"a step line matches no template: {lines}"
    boxed = re.fullmatch(r"\\boxed\{(\d+)\}", lines[-1])
    assert boxed, f"the line before the tail is not \\boxed{{N}}: {lines[-1]!r}"
    return steps, int(boxed.group(1)), tail


# -- v1 unchanged -------------------------------------------------------------------------------------------
# sha256 of json.dumps(rows, sort_keys=True)[:16] of generate_dataset(level, 8, seed=0, split), computed on the
# commit before task family v2 (a12838f): the v1 families' rows must stay byte-identical.
V1_HASHES = {
    ("L0", "eval"): "e9e7ae232aa5c766", ("L1", "eval"): "9070d350f927a182", ("L2", "eval"): "37ef88cad5c3a6f1",
    ("L3", "eval"): "7fa0e815761e8e2c", ("L4", "eval"): "8d252ae3ddfab1c3", ("L5", "eval"): "2126542f9ff857e8",
    ("T1", "eval"): "470da5096d929240", ("T2", "eval"): "639733ecaf4548b1", ("L2", "train"): "62f298152d31b47c",
}


@pytest.mark.parametrize("level, split", list(V1_HASHES))
def test_v1_rows_are_byte_identical(level, split):
    rows = generate_dataset(level, 8, seed=0, split=split)
    assert hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16] == V1_HASHES[level, split]


def test_v2_rows_are_pinned():
    """Cached data sets are keyed by the config, not the generator: a change to v2's output must bump
    slime_ext.tasks.prepare.TASK_V2_FORMAT (then update this hash), or runs would reuse stale data."""
    rows = generate_dataset(V2, 18, seed=0, split="eval", recheck_share=0.5)
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]
    assert digest == "3a351745b882ecc2", "v2 rows changed: bump TASK_V2_FORMAT in slime_ext/tasks/prepare.py"


def test_level_table():
    assert list(ALL_LEVELS) == [*LEVELS, *TOOL_LEVELS, *V2]
    assert V2 == [f"V{k}" for k in range(2, 11)]
    assert [V2_LEVELS[k].n_steps for k in V2] == list(range(2, 11))
    # harder as the number grows: the cap, the operands and the factors never shrink
    for easy, hard in zip(V2, V2[1:]):
        e, h = V2_LEVELS[easy], V2_LEVELS[hard]
        assert h.max_value >= e.max_value and h.operand_max >= e.operand_max and h.factor_max >= e.factor_max
    assert set(V2_LEVELS["V2"].ops) == {"+", "-"} and set(V2_LEVELS["V10"].ops) == {"+", "-", "*", "/"}


# -- determinism --------------------------------------------------------------------------------------------
def test_rows_are_a_function_of_the_seed():
    pool = ["V2", "V6", "V10"]
    a = generate_dataset(pool, 45, seed=3, split="eval")
    random.seed(1)  # the global RNG plays no part
    assert generate_dataset(pool, 45, seed=3, split="eval") == a
    b = generate_dataset(pool, 45, seed=4, split="eval")
    assert len({r["prompt"] for r in a} & {r["prompt"] for r in b}) == 0
    assert generate_dataset(pool, 20, seed=3, split="eval") == a[:20]  # a shorter request is a prefix
    assert [r["level"] for r in a[:6]] == pool * 2  # one pool, levels interleaved, each row records its level


def test_train_rows_avoid_heldout_prompts():
    evals = {r["prompt"] for r in generate_dataset("V2", 300, seed=0, split="eval")}
    train = generate_dataset("V2", 300, seed=0, split="train", heldout_reserve=300)
    assert not evals & {r["prompt"] for r in train}


# -- steps, arithmetic, ranges ------------------------------------------------------------------------------
@pytest.mark.parametrize("level", V2)
def test_steps_per_level_and_their_arithmetic(rows_by_level, level):
    spec: StepLevel = V2_LEVELS[level]
    for r in rows_by_level[level]:
        steps, boxed, _ = parse(r["solution"])
        assert r["level"] == level and r["num_steps"] == len(steps) == spec.n_steps
        assert [s.k for s in steps] == list(range(1, spec.n_steps + 1))
        assert spec.start_min <= steps[0].a <= spec.start_max
        for s, nxt in zip(steps, steps[1:]):
            assert nxt.a == s.c, f"steps do not chain in {r['id']}"
        for s in steps:
            assert s.op in spec.ops and apply_op(s.a, s.op, s.b) == s.c
            assert MIN_VALUE <= s.c <= spec.max_value
            lo, hi = (spec.operand_min, spec.operand_max) if s.op in "+-" else (spec.factor_min, spec.factor_max)
            assert lo <= s.b <= hi
        assert steps[-1].c == boxed == int(r["label"])
        # the story states the start and every operand, in order, and nothing else
        assert [int(x) for x in re.findall(r"\d+", r["prompt"])] == [steps[0].a] + [s.b for s in steps]


def test_choose_op_keeps_every_level_in_range():
    rng = random.Random(0)
    for spec in V2_LEVELS.values():
        for value in (MIN_VALUE, spec.start_max, spec.max_value - 1, spec.max_value):
            for _ in range(50):
                op, b = choose_op(rng, spec, value)
                assert MIN_VALUE <= apply_op(value, op, b) <= spec.max_value


@pytest.mark.parametrize("op", list(STEP_TEMPLATES))
def test_each_operation_appears_in_at_least_three_phrasings(rows_by_level, op):
    assert len(STEP_TEMPLATES[op]) >= 3 and len(STORY_PHRASES[op]) >= 3
    seen = {s.template for rows in rows_by_level.values() for r in rows for s in parse(r["solution"])[0]
            if s.op == op}
    assert len(seen) >= 3, f"{op}: only templates {seen} appear"
    assert seen == set(range(len(STEP_TEMPLATES[op])))  # in fact every one of them


def test_step_units_vary_in_size(rows_by_level):
    """Pacing: within one level a step's length depends on its phrasing (characters here; tokens below)."""
    sizes = [len(line) for r in rows_by_level["V6"] for line in split_tail(r["solution"])[0].split("\n")[:-1]]
    assert max(sizes) >= 2.5 * min(sizes)


# -- the verifier ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", V2)
def test_references_score_one_and_corrupted_answers_zero(rows_by_level, level):
    """What the check_references stage asserts, on every level, with and without tails."""
    rows = rows_by_level[level]
    assert {r["recheck"] for r in rows} == {True, False}
    for r in rows:
        assert verify(r["solution"], r["label"]).score == 1.0
        assert verify(_corrupt_final_answer(r["solution"], r["label"]), r["label"]).score == 0.0


def test_the_tail_starts_with_the_marker_and_the_answer_reads_the_same_with_or_without_it(rows_by_level):
    n_tails = 0
    for rows in rows_by_level.values():
        for r in rows:
            steps, boxed, tail = parse(r["solution"])
            assert (tail is not None) == r["recheck"]
            if tail is None:
                assert RECHECK_MARKER not in r["solution"]
                continue
            n_tails += 1
            body = split_tail(r["solution"])[0]
            assert r["solution"] == body + "\n" + tail  # the tail is the last line, on its own
            assert tail.startswith(RECHECK_MARKER) and tail.endswith(f"\\boxed{{{r['label']}}}")
            assert tail.count(RECHECK_MARKER) == 1 and "\n" not in tail
            # trimmed at the marker (what a marker-gated abort leaves) or whole: the same answer, score 1
            assert verify(body, r["label"]).score == 1.0 and verify(r["solution"], r["label"]).score == 1.0
            # one of the templates, its equations right: the last two steps again, or the last one undone
            assert any(tail.startswith(t.split("{")[0]) for t in TAIL_TEMPLATES)
            last = {(s.a, s.op, s.b, s.c) for s in steps[-2:]}
            undo = {"+": "-", "-": "+", "*": "/", "/": "*"}
            last.add((steps[-1].c, undo[steps[-1].op], steps[-1].b, steps[-1].a))
            equations = re.findall(r"(\d+) ([+\-*/]) (\d+) = (\d+)", tail)
            assert equations and {(int(a), op, int(b), int(c)) for a, op, b, c in equations} <= last
    assert n_tails > 0


def test_tails_follow_the_step_separator():
    """Paragraph steps (data.synthetic.step_separator: "\\n\\n") put the tail in its own paragraph."""
    r = next(r for r in generate_dataset("V3", 40, seed=1, split="eval", recheck_share=1.0))
    paragraphs = r["solution"].replace("\n", "\n\n")
    body, tail = split_tail(paragraphs)
    assert tail.startswith(RECHECK_MARKER) and body.endswith(f"\\boxed{{{r['label']}}}")


# -- the re-check share -------------------------------------------------------------------------------------
def test_recheck_share_within_a_binomial_bound():
    n, share = 2000, 0.25
    rows = generate_dataset(V2, n, seed=0, split="eval", recheck_share=share)
    k = sum(r["recheck"] for r in rows)
    sd = math.sqrt(n * share * (1 - share))  # 19.4
    assert abs(k - n * share) <= 4 * sd, k


def test_the_share_changes_tails_only():
    """Prompts, labels and steps do not depend on the share; a larger share adds tails to a superset of rows."""
    by_share = {s: generate_dataset(["V2", "V7"], 200, seed=2, split="eval", recheck_share=s) for s in (0, 0.25, 0.5, 1)}
    base = [(r["prompt"], r["label"], split_tail(r["solution"])[0]) for r in by_share[0]]
    for share, rows in by_share.items():
        assert [(r["prompt"], r["label"], split_tail(r["solution"])[0]) for r in rows] == base
    tails = {s: {r["id"] for r in rows if r["recheck"]} for s, rows in by_share.items()}
    assert tails[0] == set() and len(tails[1]) == 200 and tails[0.25] <= tails[0.5]
    with pytest.raises(ValueError, match="recheck_share"):
        generate_dataset("V2", 4, seed=0, split="eval", recheck_share=1.5)


def test_v1_levels_ignore_the_share():
    assert generate_dataset("L2", 8, seed=0, split="eval", recheck_share=1.0) == generate_dataset("L2", 8, 0, "eval")


# -- token lengths with the pipeline's tokenizer ------------------------------------------------------------
# Response tokens (solution + EOS) per level with an embedded tokenizer trained as the tokenizer stage trains it
# (prompt + "\n" + solution of the first train rows, vocab_size of configs/grpo_v2.yaml; 800 texts instead of
# 4000 give the same 581-token vocabulary). Bounds set by hand around the measured table of docs/tasks.md; the
# rows here have tails at share 0.5, not 0.25, so their means run a few tokens longer.
LENGTH_BOUNDS = {  # level: (mean low, mean high, max high)
    "V2": (45, 80, 130), "V3": (65, 105, 160), "V4": (95, 140, 220), "V5": (115, 170, 250),
    "V6": (150, 210, 310), "V7": (180, 250, 340), "V8": (215, 300, 420), "V9": (250, 340, 460),
    "V10": (290, 390, 480),
}


@pytest.fixture(scope="module")
def v2_tokenizer(tmp_path_factory):
    from slime_ext.tokenizer import build_embedded_tokenizer, load_tokenizer

    rows = generate_dataset(V2, 800, seed=0, split="train", heldout_reserve=N_PER_LEVEL)
    texts = [r["prompt"] + "\n" + r["solution"] for r in rows]
    return load_tokenizer(build_embedded_tokenizer(tmp_path_factory.mktemp("tok"), texts, vocab_size=640))


def test_token_lengths_per_level(rows_by_level, v2_tokenizer):
    from slime_ext.tasks.v2.measure import level_lengths

    stats = level_lengths([r for rows in rows_by_level.values() for r in rows], v2_tokenizer, "plain")
    assert list(stats) == V2
    for level, (lo, hi, top) in LENGTH_BOUNDS.items():
        s = stats[level]
        assert lo <= s["response_mean"] <= hi and s["response_max"] <= top, (level, s)
        assert s["prompt_max"] <= 256  # configs/grpo_v2.yaml's rollout.max_prompt_len
    means = [stats[lvl]["response_mean"] for lvl in V2]
    assert means == sorted(means)
    assert all(200 <= stats[lvl]["response_mean"] <= 400 for lvl in ("V8", "V9", "V10"))  # the hard levels


def test_step_token_lengths_vary_within_a_level(rows_by_level, v2_tokenizer):
    per_template = defaultdict(list)
    for r in rows_by_level["V8"]:
        for line in split_tail(r["solution"])[0].split("\n")[:-1]:
            step = parse_step(line)
            per_template[step.template].append(len(v2_tokenizer(line)["input_ids"]))
    means = {t: statistics.mean(v) for t, v in per_template.items()}
    assert max(means.values()) >= 1.8 * min(means.values()), means  # the terse form vs the narrative one


# -- the lengths of a method's own format (SxS) ---------------------------------------------------------------
def _sxs_v2_config(tmp_path, *overrides):
    """configs/sxs_sft.yaml on task v2 at the SxS study's disclosure share (scripts/sxs_study.py)."""
    from slime_ext.config import load_config

    repo = Path(__file__).resolve().parents[2]
    path = tmp_path / "sxs_v2.yaml"
    path.write_text(f"extends: [{repo / 'configs/sxs_sft.yaml'}, {repo / 'configs/tasks/v2.yaml'}]\n"
                    "sxs:\n  disclosure_share: 0.5\n")
    return load_config(path, list(overrides)).config


def test_measured_rows_are_in_the_methods_format(tmp_path, v2_tokenizer):
    """The SxS formats measured with the CoT tokenizer: same prompts and labels, references ~1.6x CoT's (the SxS
    study's design, docs/methods/sxs.md); the restated control about as long as the interleaved format."""
    from slime_ext.config import load_config
    from slime_ext.methods.registry import data_transform
    from slime_ext.tasks.v2.measure import level_lengths, measured_rows

    def rows(config):
        return measured_rows(config, 40, data_transform(config))

    repo = Path(__file__).resolve().parents[2]
    cot = rows(load_config(repo / "configs/grpo_v2.yaml").config)
    sxs = rows(_sxs_v2_config(tmp_path))
    restated = rows(_sxs_v2_config(tmp_path, "sxs.answer_placement=after_reasoning"))
    assert [r["id"] for r in cot] == [r["id"] for r in sxs] == [r["id"] for r in restated]
    assert [r["label"] for r in cot] == [r["label"] for r in sxs]
    assert all(r["solution"].startswith("<think>") and "</speak>" in r["solution"] for r in sxs + restated)
    assert all(r["solution"].count("<speak>") == 1 for r in restated)  # the whole account after the reasoning
    assert max(r["solution"].count("<speak>") for r in sxs) >= 3

    def mean_len(rows):
        stats = level_lengths(rows, v2_tokenizer, "plain")
        return sum(s["response_mean"] * s["rows"] for s in stats.values()) / len(rows)

    ratio = mean_len(sxs) / mean_len(cot)
    assert 1.4 <= ratio <= 1.8, ratio  # measured 1.58 on the 1026-row eval set
    assert abs(mean_len(restated) / mean_len(sxs) - 1) <= 0.05


def test_pipeline_tokenizer_trains_on_the_methods_rows(tmp_path):
    """As the driver does, the embedded tokenizer learns from the transformed rows: merges of the SxS format's
    words ("So the answer is", "...</think><speak>") are in its vocabulary, not in the CoT one's."""
    from slime_ext.config import load_config
    from slime_ext.methods.registry import data_transform
    from slime_ext.tasks.v2.measure import pipeline_tokenizer

    small = ["data.synthetic.n_train=300", "data.synthetic.n_eval=20", "tokenizer.n_training_texts=300"]
    repo = Path(__file__).resolve().parents[2]
    config = _sxs_v2_config(tmp_path, *small)
    sxs = pipeline_tokenizer(config, tmp_path / "cache", data_transform(config))
    cot = pipeline_tokenizer(load_config(repo / "configs/grpo_v2.yaml", small).config, tmp_path / "cache")
    assert {"Ġanswer", "><"} <= set(sxs.get_vocab())
    assert not {"Ġanswer", "><"} & set(cot.get_vocab())


def test_reference_lengths_cli_measures_the_configs_own_format(tmp_path, v2_tokenizer, capsys):
    """`python -m slime_ext.tools.reference_lengths` on the SxS config, in a given tokenizer's tokens: the table's
    V2 row is the SxS format's (the interleaved references of the same rows), not CoT's."""
    from slime_ext.methods.registry import data_transform
    from slime_ext.tasks.v2.measure import level_lengths, measured_rows
    from slime_ext.tools.reference_lengths import main

    v2_tokenizer.save_pretrained(tmp_path / "tok")
    overrides = [f"tokenizer.path={tmp_path / 'tok'}", "data.synthetic.eval_levels=[V2]"]
    config = _sxs_v2_config(tmp_path, *overrides)
    assert main([str(tmp_path / "sxs_v2.yaml"), *overrides, "--per-level", "30"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| V2 |")]
    expected = level_lengths(measured_rows(config, 30, data_transform(config)), v2_tokenizer, config.data.template)["V2"]
    plain = level_lengths(measured_rows(config, 30), v2_tokenizer, config.data.template)["V2"]
    assert row == [f"| V2 | 30 | {expected['response_mean']} | {expected['response_min']} | {expected['response_max']} | "
                   f"{expected['prompt_mean']} | {expected['prompt_max']} | {expected['recheck_share']} |"]
    assert expected["response_mean"] >= 1.5 * plain["response_mean"]
