"""The run logger: metrics.jsonl, TensorBoard event files read back, W&B offline (slime_ext.orchestration.run_logger)."""

from __future__ import annotations

import json
import logging

import pytest

from slime_ext.config.schema import Config
from slime_ext.orchestration.run_logger import RunLogger


def _cfg(**kw):
    return Config(logging=kw).logging


def _tb_scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_gets_the_same_numbers_as_metrics_jsonl(tmp_path, caplog):
    rows = [{"step": s, "reward/mean": 0.25 * s, "time/step": 2.0, "rollout/epoch": 0, "note": "x", "flag": True,
             "bad": float("nan")} for s in range(3)]
    logger = RunLogger(tmp_path, _cfg(), log_every=2)
    with caplog.at_level(logging.INFO, logger="slime_ext.orchestration.run_logger"):
        for row in rows:
            logger.log(row)
    logger.close()
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == json.loads(
        json.dumps(rows))  # NaN survives as NaN in JSON; compare through one round trip
    scalars = _tb_scalars(tmp_path / "tensorboard")
    assert scalars["reward/mean"] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert scalars["rollout/epoch"] == [(0, 0.0), (1, 0.0), (2, 0.0)]
    assert not {"note", "flag", "bad", "step"} & set(scalars)  # strings, booleans, NaN and the x axis are not scalars
    # run.log_every=2: a summary line after steps 1 (the 2nd) only
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["step 1: reward/mean=0.25, time/step=2"]


def test_resume_purges_the_killed_runs_later_steps(tmp_path):
    first = RunLogger(tmp_path, _cfg())
    for s in range(4):  # steps 2 and 3 were logged, then the run died before checkpointing them
        first.log({"step": s, "reward/mean": float(s)})
    first.close()
    resumed = RunLogger(tmp_path, _cfg(), start_step=2)
    for s in (2, 3):
        resumed.log({"step": s, "reward/mean": 10.0 + s})
    resumed.close()
    assert _tb_scalars(tmp_path / "tensorboard")["reward/mean"] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]


def test_tensorboard_off_writes_no_event_files(tmp_path):
    logger = RunLogger(tmp_path, _cfg(tensorboard=False))
    logger.log({"step": 0, "reward/mean": 1.0})
    logger.close()
    assert not (tmp_path / "tensorboard").exists() and (tmp_path / "metrics.jsonl").exists()


@pytest.mark.timeout(120)
def test_wandb_offline_run_keeps_its_id_and_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = _cfg(tensorboard=False, wandb=True, wandb_mode="offline", wandb_project="test")
    logger = RunLogger(tmp_path, cfg, run_name="unit", config={"method": "grpo"})
    for s in range(2):
        logger.log({"step": s, "reward/mean": 0.5 + s})
    logger.close()
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1
    history = _wandb_history(next(runs[0].glob("*.wandb")))
    assert [(int(h["_step"]), float(h["reward/mean"])) for h in history] == [(0, 0.5), (1, 1.5)]


def _wandb_history(path):
    """History rows of an offline `.wandb` file: a LevelDB-format log (7-byte file header, 32 KiB blocks,
    chunks with a 7-byte header: crc32, length, type full/first/middle/last) of wandb Record protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos = path.read_bytes(), 32768, 7
    payloads, pending = [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer too short for a header: skip to the next block
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            payloads.append(chunk)
        elif kind in (2, 3):
            pending = (pending if kind == 3 else b"") + chunk
        elif kind == 4:
            payloads.append(pending + chunk)
    rows = []
    for payload in payloads:
        record = pb.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def test_wandb_mode_is_validated():
    with pytest.raises(Exception, match="wandb_mode"):
        Config(logging={"wandb_mode": "cloud"})
