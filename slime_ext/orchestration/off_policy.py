"""One-step off-policy RL (`rollout.off_policy_steps: 1`): the rollout of step t+1 runs while step t trains.

`OffPolicyRollouts` wraps the rollout manager and the engine so that the loop's step (`TrainingJob._rl_step`)
stays the on-policy one: it is the step's manager (`rollout`, `loss_spec`, `update`, `state_dict`, and the
method's `evaluate_after_step` / `release_method`) and its engine (`sync_weights`). Per step t:

  rollout(t)       hands over the rollout of step t (collected during step t-1; step 0's, and the first after
                   a resume without a saved one, is generated here), then starts rollout(t+1) in the
                   background with the weights the engine serves now, version t;
  train(t)         runs beside that rollout;
  sync_weights     without partial rollouts: waits for rollout(t+1), then syncs version t+1 (so every
                   token of rollout t+1 is of version t: staleness exactly 1 when trained at step t+1);
                   with partial rollouts: the manager aborts the requests in flight, the weights are
                   synced, the aborted requests continue with version t+1, then the rollout is collected
                   (tokens of version t and t+1: staleness <= 1);
  update(t)        the method's controllers, after rollout(t+1) is collected (the manager is idle), so a
                   controller updated at step t shapes the plan of step t+2.

Each rollout keeps the method's loss spec as it was when the rollout was collected (before update(t), like
the on-policy step's), and `loss_spec()` gives the one of the rollout `rollout(t)` handed over.

A checkpoint after step t is written with rollout(t+1) collected: the manager's state (data offset past
rollout t+1's prompts, controllers after update(t)) and the collected rollout itself (`pending_rollout`,
with its loss spec),
so a resume trains step t+1 on the same batch the uninterrupted run would have, and no prompt is skipped or
drawn twice. A checkpoint without one (written by an on-policy run) regenerates it on resume.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Optional

from slime_ext.algo import LossSpec
from slime_ext.data import Sample
from slime_ext.orchestration.rollout_manager import ENGINE_EVENTS_KEY

PENDING_KEY = "pending_rollout"


class _ThreadResult:
    """A call run in a daemon thread (a rollout manager in the driver process); `.result()` joins it."""

    def __init__(self, fn: Any, *args: Any):
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(fn, *args), name="off-policy-rollout", daemon=True)
        self._thread.start()

    def _run(self, fn: Any, *args: Any) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the driver by result()
            self._error = exc

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class OffPolicyRollouts:
    """The loop's manager and engine for `rollout.off_policy_steps: 1` (see the module docstring)."""

    def __init__(self, manager: Any, engine: Any, steps: int, partial_rollouts: bool = False):
        self.manager = manager
        self.engine = engine
        self.steps = steps
        self.partial = partial_rollouts
        self.train_kind = manager.train_kind
        self.pending: Optional[tuple[int, Any]] = None  # (step, rollout in flight)
        # collected, not trained yet: (step, groups, metrics, loss spec)
        self.ready: Optional[tuple[int, list[list[Sample]], dict, LossSpec]] = None
        self.loss: Optional[LossSpec] = None  # the loss spec of the rollout handed over last
        self.handed_at: Optional[float] = None  # wall time the trainer got its batch (its window starts)

    # -- the manager side -------------------------------------------------------------------------
    def _start(self, step: int, version: int) -> Any:
        start = getattr(self.manager, "start_rollout", None)
        if start is not None:  # a Ray actor: the call is in flight while the driver trains
            return start(step, version)
        return _ThreadResult(self.manager.rollout, step, version)

    def _collect(self, handle: Any) -> tuple[list[list[Sample]], dict, LossSpec]:
        """The rollout, and the method's loss spec right after it (the manager is idle: nothing in between)."""
        groups, row = handle.result()
        return groups, dict(row), self.manager.loss_spec()

    def rollout(self, step: int) -> tuple[list[list[Sample]], dict]:
        """Step `step`'s rollout; starts the next one (generated with version `step`) before returning."""
        if self.pending is not None:  # a step ended without a sync (should not happen): collect first
            self._finish_pending()
        if self.ready is not None and self.ready[0] == step:
            _, groups, row, loss = self.ready
        else:  # the first step, or a resume from a checkpoint without a collected rollout: generate it now
            groups, row, loss = self._collect(self._start(step, step))
        self.ready = None
        self.loss = loss
        # the loop's private keys stay here, the restart events go on to the driver's report
        row = {k: v for k, v in row.items() if not k.startswith("_") or k == ENGINE_EVENTS_KEY}
        if step + 1 < self.steps:
            self.pending = (step + 1, self._start(step + 1, step))
        self.handed_at = time.time()
        return groups, row

    def loss_spec(self) -> LossSpec:
        """The loss spec of the rollout `rollout` handed over last (kept with it when it was collected)."""
        if self.loss is None:
            raise RuntimeError("off-policy loop: the loss spec was asked for before any rollout was handed over")
        return self.loss

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        return self.manager.update(stats, step)

    def evaluate_after_step(self, row: dict[str, Any], run_dir: str | Path) -> None:
        self.manager.evaluate_after_step(row, run_dir)

    def release_method(self) -> Any:
        return self.manager.release_method()

    def state_dict(self) -> dict[str, Any]:
        if self.pending is not None:
            raise RuntimeError("off-policy loop: the manager's state was asked for while a rollout is in flight")
        state = dict(self.manager.state_dict())
        if self.ready is not None:
            step, groups, row, loss = self.ready
            state[PENDING_KEY] = {"step": step, "groups": [[s.to_dict() for s in g] for g in groups], "row": row,
                                  "loss": dataclasses.asdict(loss)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        pending = state.pop(PENDING_KEY, None)
        self.manager.load_state_dict(state)
        self.ready = None
        if pending is not None:
            groups = [[Sample.from_dict(dict(d)) for d in g] for g in pending["groups"]]
            # a pending rollout saved without its spec (before specs travelled with rollouts): the restored method's
            loss = LossSpec(**pending["loss"]) if "loss" in pending else self.manager.loss_spec()
            self.ready = (int(pending["step"]), groups, dict(pending["row"]), loss)

    # -- the engine side --------------------------------------------------------------------------
    def _finish_pending(self) -> dict[str, float]:
        step, handle = self.pending
        self.pending = None
        groups, row, loss = self._collect(handle)
        self.ready = (step, groups, row, loss)
        return row

    def sync_weights(self, source: Any, version: int | str) -> dict[str, float]:
        """The trainer's weights as `version`, with the rollout in flight finished around it (waited for,
        or with partial rollouts aborted, synced under and continued). Adds `time/overlap` (seconds of the
        next rollout's generation inside the trainer's window: from handing over this step's batch to this
        sync) and `time/rollout_wait` (the sync waiting for the rollout: generation the trainer did not hide)."""
        t_sync = time.time()
        if self.pending is None:  # the last step: nothing in flight
            return {**self.engine.sync_weights(source, version), "time/overlap": 0.0, "time/rollout_wait": 0.0}
        if self.partial:
            self.manager.pause_generation()
            try:
                sync = self.engine.sync_weights(source, version)
            finally:
                self.manager.resume_generation(int(version))
            t_resumed = time.time()
            row = self._finish_pending()
            waited = time.time() - t_resumed  # the continued requests' rest: the sync itself did not wait
        else:
            row = self._finish_pending()
            waited = time.time() - t_sync
            sync = self.engine.sync_weights(source, version)
        start, end = row.pop("_t_generate_start", None), row.pop("_t_generate_end", None)
        overlap = 0.0
        if start is not None and end is not None and self.handed_at is not None:
            overlap = max(0.0, min(end, t_sync) - max(start, self.handed_at))
        return {**sync, "time/overlap": overlap, "time/rollout_wait": waited}


__all__ = ["OffPolicyRollouts", "PENDING_KEY"]
