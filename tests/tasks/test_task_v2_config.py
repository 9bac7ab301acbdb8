"""Task family v2 in the config and data path: level names, data.synthetic.recheck_share, the cache keys,
configs/grpo_v2.yaml, and the rows through prepare_data and the loader."""

from __future__ import annotations

import hashlib
import json

import pytest

from slime_ext.config import ConfigError, load_config
from slime_ext.config.__main__ import main as config_main
from slime_ext.config.sections import DEFAULT_RECHECK_SHARE, DataConfig, SyntheticDataConfig
from slime_ext.orchestration.driver import _corrupt_final_answer
from slime_ext.rewards import get_verifier
from slime_ext.tasks import prepare
from slime_ext.tasks.prepare import SYNTHETIC_FORMAT, prepare_data
from slime_ext.tasks.v2 import recheck
from tests.conftest import CONFIGS

GRPO, GRPO_V2 = CONFIGS / "grpo.yaml", CONFIGS / "grpo_v2.yaml"
SMALL = {"train_levels": ["V2", "V5", "V9"], "eval_levels": ["V3", "V10"], "n_train": 60, "n_eval": 40}


def problem(config, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(config, list(overrides))
    (msg,) = info.value.problems
    return msg


def test_grpo_v2_config_checks_and_selects_the_v2_pool(capsys):
    assert config_main(["--check", str(GRPO_V2)]) == 0
    cfg = load_config(GRPO_V2).config
    syn = cfg.data.synthetic
    assert syn.train_levels == syn.eval_levels == [f"V{k}" for k in range(2, 11)]
    assert syn.recheck_share_value() == 0.25 and cfg.rollout.max_response_len >= 448


def test_default_share_is_the_generators():
    assert DEFAULT_RECHECK_SHARE == recheck.DEFAULT_RECHECK_SHARE
    assert SyntheticDataConfig(train_levels=["V4"]).recheck_share_value() == DEFAULT_RECHECK_SHARE


@pytest.mark.parametrize("overrides, named", [
    (["data.synthetic.recheck_share=0.5"], "data.synthetic.recheck_share = 0.5"),  # no v2 level: does nothing
    (["data.synthetic.recheck_share=1.5"], "data.synthetic.recheck_share"),  # out of [0, 1]
    (["data.synthetic.train_levels=[V11]"], "data.synthetic.train_levels.0"),
])
def test_bad_v2_keys_are_rejected_with_the_key_named(overrides, named):
    assert named in problem(GRPO, *overrides)


def test_a_tool_solution_on_v2_levels_is_rejected():
    msg = problem(GRPO_V2, "data.synthetic.solution_tool=calculator", "rollout.env=tools",
                  "rollout.env_settings={tools: [calculator]}")
    assert "data.synthetic.solution_tool = 'calculator'" in msg and "v2 levels" in msg


V2_PHASES = ("dagrpo.phases=[{name: easy, levels: [V2, V3], steps: 20, step_limit: 3}, "
             "{name: hard, levels: [V6], steps: 20, step_limit: 6}]")


def test_a_dagrpo_config_with_v2_phases_checks(capsys):
    """DA-GRPO's `solver:` cloud reads v2 stories (`solve_story`), so its phases take v2 levels."""
    overrides = [V2_PHASES, "data.synthetic.train_levels=[V2, V3, V6]", "data.synthetic.eval_levels=[V2, V3, V6]",
                 "data.synthetic.recheck_share=1.0"]
    assert config_main(["--check", str(CONFIGS / "dagrpo.yaml"), *overrides]) == 0
    cfg = load_config(CONFIGS / "dagrpo.yaml", overrides).config
    assert [p.levels for p in cfg.dagrpo.phases] == [["V2", "V3"], ["V6"]]
    assert cfg.dagrpo.cloud_url == "solver:synthetic_math_answer"
    mixed = "dagrpo.phases=[{name: a, levels: [L1, V4], steps: 40, step_limit: 4}]"  # families mix too
    assert load_config(CONFIGS / "collab_grpo.yaml", [mixed]).config.dagrpo.phases[0].levels == ["L1", "V4"]


def test_a_v2_phase_needs_a_step_limit_for_its_longest_level():
    msg = problem(CONFIGS / "dagrpo.yaml", "dagrpo.phases=[{name: a, levels: [V3, V6], steps: 40}]")  # default 4
    assert "dagrpo.phases.0" in msg and "step_limit = 4" in msg and "V6 has 6 steps" in msg


# -- cache keys ---------------------------------------------------------------------------------------------
def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def test_v1_cache_keys_are_unchanged():
    """The default job's data key and warm-start data fields, as computed on the commit before v2 (a12838f)."""
    data = DataConfig()
    assert _digest([SYNTHETIC_FORMAT, data.synthetic.cache_fields(), None]) == "dae49a6b3563e3ee"
    assert _digest(data.cache_fields()) == "c34c40dca7276d53"
    assert "recheck_share" not in data.synthetic.cache_fields()


def test_v2_keys_follow_the_share():
    null, default, half = (SyntheticDataConfig(**SMALL, recheck_share=s) for s in (None, 0.25, 0.5))
    assert null.cache_fields() == default.cache_fields() != half.cache_fields()  # keyed by the value used
    assert DataConfig(synthetic=SMALL).cache_fields() != DataConfig(synthetic=dict(SMALL, recheck_share=0.5)).cache_fields()


def test_prepared_v2_rows_load_and_verify(tmp_path):
    a = prepare_data(DataConfig(synthetic=SMALL), tmp_path)
    b = prepare_data(DataConfig(synthetic=dict(SMALL, recheck_share=1.0)), tmp_path)
    assert a.train_path != b.train_path and a.train_path.parent.name != b.train_path.parent.name
    parts = [SYNTHETIC_FORMAT, SyntheticDataConfig(**SMALL).cache_fields(), None, prepare.TASK_V2_FORMAT]
    assert a.train_path.parent.name == f"synthetic-{_digest(parts)}"  # a v2 key carries the v2 version
    assert [r["level"] for r in a.eval[:4]] == ["V3", "V10", "V3", "V10"]
    assert {r["level"] for r in a.train} == {"V2", "V5", "V9"}
    assert [(r["prompt"], r["label"]) for r in a.train] == [(r["prompt"], r["label"]) for r in b.train]
    assert all(r["recheck"] for r in b.train + b.eval) and 0 < sum(r["recheck"] for r in a.train) < len(a.train)
    verify = get_verifier("math")
    for r in a.eval + b.eval:  # what the check_references stage does
        assert verify(r["solution"], r["label"]).score == 1.0
        assert verify(_corrupt_final_answer(r["solution"], r["label"]), r["label"]).score == 0.0


def test_paragraph_steps_apply_to_v2_rows(tmp_path):
    data = prepare_data(DataConfig(synthetic=dict(SMALL, step_separator="\n\n", recheck_share=1.0)), tmp_path)
    r = data.eval[0]
    assert "\n\nStep 2:" in r["solution"] and f"\n\n{recheck.RECHECK_MARKER}" in r["solution"]


def test_sxs_reads_v2_steps():
    """Every v2 step line is `Step k: ... = c.`, so SxS's triples (and its interleaving) take v2 rows; a re-check
    tail is one more reasoning paragraph."""
    from slime_ext.methods.sxs.synthetic import triple_from_row
    from slime_ext.tasks.synthetic_math import generate_dataset

    for r in generate_dataset(["V4", "V8"], 20, seed=0, split="eval", recheck_share=1.0):
        t = triple_from_row(r)
        assert len(t["reasoning"].split("\n\n")) == r["num_steps"] + 1 and t["label"] == r["label"]
        assert t["reasoning"].split("\n\n")[-1].startswith("Check:")


def test_main_job_checks_every_v2_reference(tmp_path):
    """The data, tokenizer and check_references stages of configs/grpo_v2.yaml (small sizes): every eval
    reference of the mixed pool scores 1, its corrupted copy 0, and no row is too long for the config."""
    from slime_ext.orchestration.driver import main

    rc = main([str(GRPO_V2), f"run.output_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'cache'}",
               "data.synthetic.n_train=450", "data.synthetic.n_eval=90", "tokenizer.n_training_texts=450",
               "run.stages=[data,tokenizer,check_references]"])
    assert rc == 0
    (run_dir,) = list((tmp_path / "runs").iterdir())
    stages = json.loads((run_dir / "summary.json").read_text())["stages"]
    assert stages["check_references"]["rows"] == 90
    assert stages["check_references"]["reference_correct"] == stages["check_references"]["corrupted_scored_zero"] == 1.0
    assert stages["tokenizer"]["too_long_rows"] == {"train": 0, "eval": 0}
    assert stages["tokenizer"]["max_tokens_prompt_plus_solution"] <= 256 + 480


# -- level weights -----------------------------------------------------------------------------------------
def test_level_row_counts_by_largest_remainder():
    from slime_ext.tasks.synthetic_math import level_row_counts

    assert level_row_counts(10, [1, 1, 1]) == [4, 3, 3]  # equal weights: n // L, one more for the first n % L
    assert level_row_counts(100, [6, 3, 1]) == [60, 30, 10]
    # exact shares 45.45, 36.36, 18.18: floors 45+36+18 = 99, the one left goes to the largest remainder (0.45)
    assert level_row_counts(100, [5, 4, 2]) == [46, 36, 18]
    with pytest.raises(ValueError, match="positive"):
        level_row_counts(10, [1, 0])


def test_weighted_order_keeps_the_mixture_in_every_prefix():
    from slime_ext.tasks.synthetic_math import weighted_level_order

    assert weighted_level_order([3, 3, 2]) == [0, 1, 2, 0, 1, 2, 0, 1]  # equal shares: round-robin
    order = weighted_level_order([60, 30, 10])
    assert order[:10] == [0, 1, 0, 0, 1, 0, 2, 0, 1, 0]
    for end in range(1, 101):  # every prefix within one row of its share
        for j, share in enumerate((0.6, 0.3, 0.1)):
            assert abs(order[:end].count(j) - share * end) < 1


def test_equal_weights_give_the_unweighted_rows():
    from slime_ext.tasks.synthetic_math import generate_dataset

    plain = generate_dataset(["V2", "V3", "V4"], 50, seed=0, split="train")
    assert generate_dataset(["V2", "V3", "V4"], 50, seed=0, split="train", level_weights=[2, 2, 2]) == plain


def test_weighted_pool_takes_longer_prefixes_of_the_same_streams(tmp_path):
    syn = dict(SMALL, train_level_weights=[6, 3, 1], n_train=100)
    weighted = prepare_data(DataConfig(synthetic=syn), tmp_path)
    plain = prepare_data(DataConfig(synthetic=SMALL), tmp_path)
    levels = [r["level"] for r in weighted.train]
    assert [levels.count(x) for x in ("V2", "V5", "V9")] == [60, 30, 10]
    assert weighted.eval == plain.eval  # the eval pool keeps equal shares
    for name in ("V2", "V5", "V9"):  # 60/30/10 rows against the plain pool's 20 each: one stream's prefixes
        w = [r["prompt"] for r in weighted.train if r["level"] == name]
        p = [r["prompt"] for r in plain.train if r["level"] == name]
        shorter = min(len(w), len(p))
        assert shorter in (10, 20) and w[:shorter] == p[:shorter]
    assert weighted.train_path != plain.train_path
    assert "train_level_weights" not in SyntheticDataConfig(**SMALL).cache_fields()  # null keeps old keys


@pytest.mark.parametrize("overrides, named", [
    (["data.synthetic.train_level_weights=[1, 2]"], "has 2 values but data.synthetic.train_levels has 9"),
    (["data.synthetic.train_level_weights=[1, 1, 1, 1, 0, 1, 1, 1, 1]"], "positive and finite (got [0.0])"),
])
def test_bad_level_weights_are_rejected_with_the_key_named(overrides, named):
    msg = problem(GRPO_V2, *overrides)
    assert "data.synthetic.train_level_weights" in msg and named in msg


def test_dagrpo_phases_refuse_level_weights():
    msg = problem(CONFIGS / "dagrpo.yaml", "data.synthetic.train_level_weights=[1]")
    assert "data.synthetic.train_level_weights" in msg and "dagrpo.phases" in msg


def test_the_v2_overlay_puts_any_method_on_v2_with_grpo_v2s_warm_start(tmp_path):
    """configs/tasks/v2.yaml after a method's config: the task keys are the overlay's, the method's own keys stay,
    and a method that adds nothing to the warm start's key (DUET) trains on grpo_v2's warm start (the v2 studies
    reuse one SFT per seed across arms). grpo_v2.yaml itself is grpo.yaml plus the overlay."""
    import yaml

    from slime_ext.orchestration.training_job import TrainingJob
    from tests.methods.test_sxs_study import CharTokenizer

    overlay = yaml.safe_load((CONFIGS / "tasks" / "v2.yaml").read_text())
    duet_v2 = tmp_path / "duet_v2.yaml"
    duet_v2.write_text(f"extends: [{CONFIGS / 'duet.yaml'}, {CONFIGS / 'tasks' / 'v2.yaml'}]\n")
    small = [f"run.cache_dir={tmp_path}"]
    v2, duet, duet_v1, grpo = (load_config(p, small).config for p in (GRPO_V2, duet_v2, CONFIGS / "duet.yaml", GRPO))
    for cfg in (v2, duet):
        assert cfg.data.synthetic.train_level_weights == overlay["data"]["synthetic"]["train_level_weights"]
        assert cfg.tokenizer.vocab_size == 640 and cfg.sft.steps == 1200
        assert (cfg.rollout.max_prompt_len, cfg.rollout.max_response_len) == (256, 480)
    assert duet.method == "duet" and duet.rollout.prompt_pool == duet_v1.rollout.prompt_pool == 512
    assert v2.grpo == grpo.grpo and v2.train == grpo.train

    def key(cfg):
        return TrainingJob(cfg, tmp_path, [], [], CharTokenizer(), tmp_path / "tok").warm_start_key()

    assert key(duet) == key(v2) != key(duet_v1)
