"""The main job runs the stages that exist, records them, and never claims the missing ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime_ext.config.sections import DataConfig
from slime_ext.orchestration.driver import main
from slime_ext.tasks.dataset import DatasetError
from slime_ext.tasks.prepare import prepare_data
from tests.conftest import CONFIGS


def run_job(tmp_path: Path, *overrides: str) -> dict:
    rc = main([
        str(CONFIGS / "grpo.yaml"),
        f"run.output_dir={tmp_path / 'runs'}",
        f"run.cache_dir={tmp_path / 'cache'}",
        "data.synthetic.n_train=300",
        "data.synthetic.n_eval=40",
        "tokenizer.n_training_texts=200",
        "run.stages=[data,tokenizer,check_references]",
        *overrides,
    ])
    assert rc == 0
    (run_dir,) = list((tmp_path / "runs").iterdir())
    return json.loads((run_dir / "summary.json").read_text()) | {"_dir": str(run_dir)}


def test_main_job_data_stages_record_what_they_did(tmp_path):
    summary = run_job(tmp_path)
    stages = summary["stages"]
    assert stages["data"]["train_rows"] == 300 and stages["data"]["eval_rows"] == 40
    assert 400 <= stages["tokenizer"]["vocab_size"] <= 512 and stages["tokenizer"]["word_initial_marker"] == "Ġ"
    assert stages["check_references"]["reference_correct"] == 1.0
    assert stages["check_references"]["corrupted_scored_zero"] == 1.0
    assert summary["complete"] is True and list(stages) == ["data", "tokenizer", "check_references"]
    config_text = (Path(summary["_dir"]) / "config.yaml").read_text()
    assert "n_train: 300" in config_text and "# files: " in config_text


def test_main_job_reuses_cached_data_and_tokenizer(tmp_path):
    first = run_job(tmp_path, "run.name=a")
    data_dir = Path(first["stages"]["data"]["train_path"]).parent
    tok_dir = Path(first["stages"]["tokenizer"]["path"])
    stamps = (data_dir.joinpath("train.jsonl").stat().st_mtime_ns, tok_dir.joinpath("tokenizer.json").stat().st_mtime_ns)
    rc = main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'runs2'}", f"run.cache_dir={tmp_path / 'cache'}",
               "data.synthetic.n_train=300", "data.synthetic.n_eval=40", "tokenizer.n_training_texts=200",
               "run.stages=[data,tokenizer,check_references]"])
    assert rc == 0
    assert stamps == (data_dir.joinpath("train.jsonl").stat().st_mtime_ns, tok_dir.joinpath("tokenizer.json").stat().st_mtime_ns)


def test_bad_config_exits_2_and_creates_no_run(tmp_path, capsys):
    rc = main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'runs'}", "rollout.tempurature=1"])
    assert rc == 2
    assert "did you mean 'rollout.temperature'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_jsonl_source_skips_bad_rows_and_holds_out_eval(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [json.dumps({"q": f"What is {i}+1?", "a": i + 1}) for i in range(40)]
    rows.insert(3, "{broken json")
    rows.insert(10, json.dumps({"q": "no answer"}))
    path.write_text("\n".join(rows) + "\n")
    cfg = DataConfig(source="jsonl", train_path=str(path), prompt_key="q", label_key="a")
    data = prepare_data(cfg, tmp_path / "cache")
    assert len(data.train) + len(data.eval) == 40 and len(data.eval) == 2  # 5% of 40 held out
    assert data.eval[-1]["label"] == "40"
    assert data.reports[0].skipped_by_reason == {"invalid_json": 1, "missing_key": 1}
    with pytest.raises(DatasetError, match="bad"):
        prepare_data(cfg.model_copy(update={"max_bad_fraction": 0.01}), tmp_path / "cache")


def test_default_paths_point_at_the_repository():
    """Modules that find the repository from their own path (the default config, the studies' configs)."""
    from slime_ext.orchestration import driver
    from slime_ext.tools import eval_checkpoint, study

    assert driver.DEFAULT_CONFIG.is_file() and eval_checkpoint.DEFAULT_CONFIG == driver.DEFAULT_CONFIG
    assert (study.REPO / "configs" / "grpo.yaml").is_file()
    assert driver.parse_args([]) == (driver.DEFAULT_CONFIG, [])


# -- issue 15 item 3: rows the run cannot use ----------------------------------------------------------------
def jsonl_job(tmp_path: Path, rows: list[str], *stages: str) -> int:
    """Run the data stages on a JSONL file of `rows` (raw lines); the exit code."""
    path = tmp_path / "train.jsonl"
    path.write_text("".join(r + "\n" for r in rows))
    return main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'runs'}", f"run.cache_dir={tmp_path / 'cache'}",
                 "data.source=jsonl", f"data.train_path={path}", "tokenizer.n_training_texts=100",
                 f"run.stages=[{','.join(stages or ('data', 'tokenizer'))}]"])


def good_rows(n: int) -> list[str]:
    return [json.dumps({"prompt": f"What is {i} + {i}?", "label": 2 * i, "solution": f"{i} + {i} = {2 * i}\n\\boxed{{{2 * i}}}"})
            for i in range(n)]


def test_long_and_bad_rows_are_skipped_and_counted_in_the_summary(tmp_path):
    long_row = json.dumps({"prompt": "What is 1 + 1? " * 700, "label": 2})
    rows = good_rows(30)
    rows[4:4] = [long_row, json.dumps({"prompt": "x", "label": ""}), '{"prompt": "y", "label": NaN}']
    assert jsonl_job(tmp_path, rows) == 0
    (run_dir,) = list((tmp_path / "runs").iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["skipped_rows"] == {"empty_label": 1, "non_finite_label": 1, "prompt_too_long": 1}
    assert summary["stages"]["tokenizer"]["too_long_rows"] == {"train": 1, "eval": 0}
    assert summary["stages"]["data"]["train_rows"] == 30 - 1 and summary["stages"]["data"]["eval_rows"] == 1
    assert summary["stages"]["tokenizer"]["max_tokens_prompt_plus_solution"] < 256


@pytest.mark.parametrize("rows, message", [
    ([], "no rows (the file is empty or blank)"),
    (['{"prompt": "y", "label": NaN}', '{"prompt": "x", "label": ""}', '{"prompt": "z", "label": Infinity}'],
     "no valid rows; 3 skipped, most common reason 'non_finite_label' (2x)"),
    ([json.dumps({"prompt": "What is 1 + 1? " * 700, "label": 2})] * 3 + ["not json"],
     "no row fits the run's limits"),
])
def test_an_unusable_dataset_stops_with_the_message_alone_and_no_run_dir(tmp_path, capsys, rows, message):
    rc = jsonl_job(tmp_path, rows)
    err = capsys.readouterr().err
    assert rc == 1
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert message in line and "Traceback" not in err
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_missing_dataset_file_is_one_line_too(tmp_path, capsys):
    rc = main([str(CONFIGS / "grpo.yaml"), f"run.output_dir={tmp_path / 'runs'}", "data.source=jsonl",
               f"data.train_path={tmp_path / 'nope.jsonl'}", "run.stages=[data]"])
    err = capsys.readouterr().err
    assert rc == 1 and f"error: dataset file not found: {tmp_path / 'nope.jsonl'}" in err and "Traceback" not in err
    assert list((tmp_path / "runs").iterdir()) == []


@pytest.mark.parametrize("model_file", ["tiny-qwen3-moe.yaml", "tiny-qwen3.yaml"])
def test_model_fragment_from_a_checkpoint_matches_its_config(tmp_path, model_file):
    """MODEL_CONFIG=checkpoint (the launcher): the fragment written from config.json loads as the same model
    section, so a run that includes it has no model.* key the checkpoint overrides."""
    from megatron_glue.hf_config import hf_config_from_model_config
    from slime_ext.config import load_config
    from slime_ext.orchestration.driver import checkpoint_model_fields, model_fragment

    (tmp_path / "want.yaml").write_text(f"extends: {CONFIGS / 'grpo.yaml'}\ninclude: [{CONFIGS / 'models' / model_file}]\n")
    want = load_config(tmp_path / "want.yaml", ["model.vocab_size=320", "model.rope_theta=10000.0"]).config.model
    ckpt = tmp_path / "ckpt"
    hf_config_from_model_config(want).save_pretrained(ckpt)
    fields = checkpoint_model_fields(ckpt)
    assert fields["arch"] == want.arch and fields["num_experts"] == want.num_experts and fields["rope_theta"] == 10000.0
    (tmp_path / "model.yaml").write_text(model_fragment(ckpt))
    (tmp_path / "run.yaml").write_text(f"extends: {CONFIGS / 'grpo.yaml'}\ninclude: [model.yaml]\n")
    got = load_config(tmp_path / "run.yaml").config.model
    assert got.name == "ckpt"
    for key in fields:
        assert getattr(got, key) == getattr(want, key), key
