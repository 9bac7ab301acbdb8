"""Where a step's metrics go: `metrics.jsonl` (the record the plots, studies and resume read), TensorBoard
event files in `<run dir>/tensorboard` (on by default; `tensorboard --logdir runs/`), and Weights & Biases
when `logging.wandb` is true (online, or offline with `logging.wandb_mode: offline`, synced later with
`wandb sync`). All three receive the same numbers.

On resume the logger starts at the checkpointed step: TensorBoard discards the events a killed run wrote
for later steps (`purge_step`), and W&B continues the same run (its id is kept in the run directory).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from pathlib import Path
from typing import Any, Mapping, Optional

log = logging.getLogger("slime_ext.orchestration.run_logger")
WANDB_ID_FILE = "wandb_run_id"


def _scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row (booleans and non-numbers are not plotted)."""
    out = {}
    for key, value in row.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class RunLogger:
    """Appends metrics rows to `metrics.jsonl` and mirrors them to TensorBoard / W&B as configured."""

    def __init__(self, run_dir: Path, logging_cfg: Any, log_every: int = 1, start_step: int = 0,
                 run_name: str = "run", config: Optional[Mapping[str, Any]] = None):
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.log_every = max(1, int(log_every))
        self.tb = None
        self.wandb_run = None
        if logging_cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: events of steps >= start_step left by a killed run are dropped on resume
            self.tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"),
                                    purge_step=start_step if start_step > 0 else None)
        if logging_cfg.wandb:
            self.wandb_run = self._init_wandb(logging_cfg, run_name, config)

    def _init_wandb(self, cfg: Any, run_name: str, config: Optional[Mapping[str, Any]]) -> Any:
        import wandb

        id_file = self.run_dir / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        run = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity, name=run_name, id=run_id,
                         resume="allow", mode=cfg.wandb_mode, dir=str(self.run_dir), config=dict(config or {}),
                         settings=wandb.Settings(silent=True, console="off"))
        log.info("W&B run %s (%s mode) in %s", run_id, cfg.wandb_mode, self.run_dir / "wandb")
        return run

    def log(self, row: Mapping[str, Any]) -> None:
        """Record one step (`row["step"]` is the x axis everywhere)."""
        step = int(row["step"])
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        scalars = _scalars(row)
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, global_step=step)
            self.tb.flush()  # a killed run keeps every logged step
        if self.wandb_run is not None:
            self.wandb_run.log(scalars, step=step)
        if (step + 1) % self.log_every == 0:
            keys = ("reward/mean", "response_len/mean", "train/pg_loss", "time/step", "perf/tokens_per_s")
            log.info("step %d: %s", step, ", ".join(f"{k}={scalars[k]:.4g}" for k in keys if k in scalars))

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Flush every sink. W&B's `finish()` only tells its service process the run is over; the service closes
        the run's `.wandb` log later, so `teardown()` waits for it: when close returns, the file holds every row."""
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb_run is not None:
            import wandb

            self.wandb_run.finish()
            self.wandb_run = None
            wandb.teardown()
