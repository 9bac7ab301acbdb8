"""scripts/lora_study.py: its arms load as valid configs that differ from full training only in train.lora (and
the learning rate of configs/grpo_lora.yaml), and a run's row by hand from a fake run."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CONFIGS
from tests.studies.test_studies import study_script


def test_arms_are_valid_configs_with_the_ranks_asked_and_a_constant_scale():
    from slime_ext.config import load_config

    study = study_script("lora_study")
    grid = study.arms([8, 32])
    assert list(grid) == ["full", "LoRA r8", "LoRA r32"]
    for arm, (config, extra) in grid.items():
        cfg = load_config(CONFIGS / config, extra).config
        assert cfg.train.lora.rank == {"full": 0, "LoRA r8": 8, "LoRA r32": 32}[arm]
        if cfg.train.lora.rank:
            assert cfg.train.lora.alpha / cfg.train.lora.rank == 2.0


def test_a_runs_row_by_hand(tmp_path):
    study = study_script("lora_study")
    rows = [{"step": i, "time/step": 2.0 + i, "reward/mean": 0.1 * i, "memory/peak_rss_gib": 1.0 + i / 10,
             "sync/bytes_sent": 2**20 * (4 + i)} for i in range(6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval_final.json").write_text(json.dumps({"mean@4": 0.7, "greedy": 0.8}))
    row = study.row_of(tmp_path)
    assert row["peak_rss_gib"] == pytest.approx(1.5) and row["seconds_per_step"] == pytest.approx(4.5)
    assert row["sync_mb"] == pytest.approx(6.5) and row["reward_last5"] == pytest.approx(0.3)
