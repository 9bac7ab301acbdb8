"""Asynchronous RL with a staleness bound (`rollout.max_staleness: K` >= 1): the engines generate the next
rollouts while the trainer trains, and no token trained at step t is older than weights version t - K.

`AsyncRollouts` wraps the rollout manager and the engine so that the loop's step (`TrainingJob._rl_step`)
stays the on-policy one: it is the step's manager (`rollout`, `loss_spec`, `update`, `state_dict`, and the
method's `evaluate_after_step` / `release_method`) and its engine (`sync_weights`). A producer thread asks the
manager for rollout r = 0, 1, 2, ... one after another (the manager seeds rollout r's requests by r), each
with the weights version the engines serve when it starts, and queues them; step t takes the next one.

When rollout r may start (`rollout.stale_groups`):
  wait  once the engines serve version >= r - K: step r trains it, so its tokens are at most K behind. The
        engines idle when they are K rollouts ahead; nothing is ever dropped, and rollout r is step r's.
  drop  once fewer than K + 1 rollouts are queued or in flight ahead of the trainer, whatever the version. A
        rollout whose oldest trained token is more than K versions behind the step about to train it is
        dropped (`async/dropped_groups`) and the next one taken: the engines never wait, some work is lost.

What a weight sync does with the rollout in flight (`rollout.partial_rollouts`):
  false  the sync waits for it (with `wait`, for every rollout the bound lets start, so rollout r is generated
         by exactly version max(0, r - K): a rerun or a resume reproduces every token);
  true   the manager aborts its requests, the weights are synced, and the requests continue (prompt + partial
         response) with the new weights; each token records its version and keeps its engine logprob, so a
         response spanning versions is trained with each token's own behaviour logprob (decoupled PPO:
         `grpo.old_logprobs` resolves to the trainer's proximal policy, `grpo.mismatch` weighs behaviour ->
         proximal). The engines never wait for the trainer; which versions a rollout spans depends on timing.

The method's `update(t)` runs after step t's sync; without partial rollouts the producer is idle then (it starts
the next rollout when step t + 1 asks for its batch), so a controller updated at step t shapes the plans of
rollouts started after it, K steps before they train.

A checkpoint after step t holds the manager's state (data offset past the last rollout started, the method's
controllers) and every queued rollout with its loss spec; the rollout in flight, if any, is finished first.
A resume therefore trains the same batches, and no prompt is skipped or drawn twice; the bound holds from the
first step after it (a queued rollout that a smaller K makes too stale is dropped and logged).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Optional

from slime_ext.algo import LossSpec
from slime_ext.data import Sample, SampleStatus
from slime_ext.engine.failures import StaleRollout
from slime_ext.orchestration.rollout_manager import ENGINE_EVENTS_KEY

log = logging.getLogger(__name__)

QUEUE_KEY = "async_queue"
PENDING_KEY = "pending_rollout"  # checkpoints of the one-step loop before max_staleness: one queued rollout


@dataclasses.dataclass
class QueuedRollout:
    """A collected rollout waiting for the trainer, with the loss spec the method had when it was collected."""

    index: int
    groups: list[list[Sample]]
    row: dict[str, Any]
    loss: LossSpec
    started_version: int

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "groups": [[s.to_dict() for s in g] for g in self.groups], "row": self.row,
                "loss": dataclasses.asdict(self.loss), "started_version": self.started_version}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "QueuedRollout":
        return cls(int(d["index"]), [[Sample.from_dict(dict(s)) for s in g] for g in d["groups"]], dict(d["row"]),
                   LossSpec(**d["loss"]), int(d.get("started_version", d["index"])))


def trained_versions(groups: list[list[Sample]]) -> list[int]:
    """The versions of the tokens the trainer will train (loss mask on, samples that did not fail)."""
    return [v for g in groups for s in g if s.status != SampleStatus.FAILED
            for v, m in zip(s.token_versions or [], s.loss_mask) if m > 0]


def staleness_metrics(versions: list[int], step: int, bound: int) -> dict[str, float]:
    """Trained tokens (`versions`, see `trained_versions`) by versions behind the trainer at `step`
    (`async/tokens_behind_<d>`, d = 0..K), their max and mean."""
    behind = [step - v for v in versions]
    out = {f"async/tokens_behind_{d}": float(sum(b == d for b in behind)) for d in range(bound + 1)}
    out.update({"rollout/staleness_max": float(max(behind, default=0)),
                "rollout/staleness_mean": sum(behind) / len(behind) if behind else 0.0})
    return out


class AsyncRollouts:
    """The loop's manager and engine for `rollout.max_staleness` >= 1 (see the module docstring)."""

    def __init__(self, manager: Any, engine: Any, steps: int, max_staleness: int, partial_rollouts: bool = False,
                 stale_groups: str = "wait"):
        if max_staleness < 1:
            raise ValueError(f"AsyncRollouts needs max_staleness >= 1, got {max_staleness}")
        self.manager, self.engine = manager, engine
        self.steps, self.bound = steps, max_staleness
        self.partial, self.drop = partial_rollouts, stale_groups == "drop"
        self.train_kind = manager.train_kind
        self._cv = threading.Condition()
        self.queue: dict[int, QueuedRollout] = {}
        self.next_index = 0  # the next rollout the producer starts
        self.taken = 0  # the next rollout the trainer takes (every earlier one trained or dropped)
        self.version = 0  # the weights version a rollout starting now is generated with
        self.held = True  # no rollout starts (before the first step; during a checkpoint)
        self.in_flight: Optional[int] = None
        self.in_flight_since = 0.0
        self.error: Optional[BaseException] = None
        self.closed = False
        self.busy: list[tuple[float, float]] = []  # when the engines generated (start, end), for idle fractions
        self.dropped_total = 0
        self.restored = False  # load_state_dict found a saved queue
        self.loss: Optional[LossSpec] = None  # the loss spec of the rollout handed over last
        self.step_start: Optional[float] = None
        self.trainer_wait = 0.0
        self._thread = threading.Thread(target=self._produce, name="async-rollouts", daemon=True)
        self._thread.start()

    # -- the producer ------------------------------------------------------------------------------
    def _may_start(self) -> bool:
        r = self.next_index
        if self.held:
            return False
        if self.drop:  # at most K + 1 rollouts queued or in flight ahead of the trainer
            return r < self.taken + self.bound + 1
        return r <= self._last_admitted()

    def _last_admitted(self) -> int:
        """stale_groups wait: the last rollout the bound lets start at the current version (none past the run)."""
        return min(self.version + self.bound, self.steps - 1)

    def _produce(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self.closed or self._may_start())
                if self.closed:
                    return
                r, version = self.next_index, self.version
                self.next_index += 1
                self.in_flight, self.in_flight_since = r, time.time()
            t0 = self.in_flight_since
            try:
                groups, row = self.manager.rollout(r, version)
                loss = self.manager.loss_spec()  # the method's spec right after it (before any later update)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the driver by the next step
                with self._cv:
                    self.error, self.in_flight = exc, None
                    self._cv.notify_all()
                return
            with self._cv:
                self.queue[r] = QueuedRollout(r, groups, dict(row), loss, version)
                self.busy.append((t0, time.time()))
                self.in_flight = None
                self._cv.notify_all()

    def _wait(self, condition: Any) -> None:
        """Wait (holding the lock) until `condition()`; a producer error is raised here, in the driver."""
        self._cv.wait_for(lambda: self.error is not None or condition())
        if self.error is not None:
            raise self.error

    def close(self, timeout: float = 600.0) -> None:
        """Stop the producer (after its rollout in flight, which it then drops; a daemon thread still in it after
        `timeout` seconds is left to end with its actors)."""
        with self._cv:
            self.closed = True
            self._cv.notify_all()
        self._thread.join(timeout=timeout)

    # -- the manager side -------------------------------------------------------------------------
    def rollout(self, step: int) -> tuple[list[list[Sample]], dict]:
        """Step `step`'s batch: the next queued rollout within the bound (waited for if not collected yet)."""
        t0 = time.time()
        dropped = 0
        with self._cv:
            if not self.partial:  # the engines serve `step` now (synced after step - 1, or restored)
                self.version = max(self.version, step)
            self.held = False
            self._cv.notify_all()
            while True:
                self._wait(lambda: self.taken in self.queue)
                item = self.queue.pop(self.taken)
                self.taken += 1
                versions = trained_versions(item.groups)
                if versions and max(versions) > step:
                    raise StaleRollout(f"step {step}: rollout {item.index} holds tokens of weight version "
                                       f"{max(versions)}, newer than the trainer's {step}: a bug in the version count")
                if versions and min(versions) < step - self.bound:
                    n = len(item.groups)
                    dropped += n
                    if not self.drop:
                        log.warning("step %d: rollout %d (%d groups) holds tokens of version %d, more than "
                                    "rollout.max_staleness = %d behind (restored from a checkpoint written under a "
                                    "larger bound?): dropped", step, item.index, n, min(versions), self.bound)
                    continue
                break
        self.dropped_total += dropped
        self.trainer_wait = time.time() - t0
        self.step_start = t0
        self.loss = item.loss
        # the loop's private keys stay here, the restart events go on to the driver's report
        row = {k: v for k, v in item.row.items() if not k.startswith("_") or k == ENGINE_EVENTS_KEY}
        row.update(staleness_metrics(versions, step, self.bound))
        row.update({"async/rollout_index": float(item.index), "async/started_version": float(item.started_version),
                    "async/dropped_groups": float(dropped), "async/dropped_groups_total": float(self.dropped_total),
                    "async/queued": float(len(self.queue)), "time/rollout_wait": self.trainer_wait})
        return item.groups, row

    def loss_spec(self) -> LossSpec:
        """The loss spec of the rollout `rollout` handed over last (kept with it when it was collected)."""
        if self.loss is None:
            raise RuntimeError("asynchronous loop: the loss spec was asked for before any rollout was handed over")
        return self.loss

    def update(self, stats: dict[str, float], step: int) -> dict[str, float]:
        return self.manager.update(stats, step)

    def evaluate_after_step(self, row: dict[str, Any], run_dir: Any) -> None:
        self.manager.evaluate_after_step(row, run_dir)

    def release_method(self) -> Any:
        self.close()
        return self.manager.release_method()

    def _drained(self) -> None:
        """Hold the producer and wait for its rollout in flight (the caller holds the lock)."""
        self.held = True
        self._wait(lambda: self.in_flight is None)

    def state_dict(self) -> dict[str, Any]:
        """The manager's state and the queued rollouts; the rollout in flight is finished first, and the next
        starts when the next step asks for its batch."""
        with self._cv:
            self._drained()
            state = dict(self.manager.state_dict())
            state[QUEUE_KEY] = {"taken": self.taken, "next": self.next_index, "dropped_total": self.dropped_total,
                                "rollouts": [q.to_dict() for _, q in sorted(self.queue.items())]}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        saved = state.pop(QUEUE_KEY, None)
        pending = state.pop(PENDING_KEY, None)
        self.manager.load_state_dict(state)
        with self._cv:
            self.queue.clear()
            if saved is not None:
                self.taken, self.next_index = int(saved["taken"]), int(saved["next"])
                self.dropped_total = int(saved.get("dropped_total", 0))
                for d in saved["rollouts"]:
                    q = QueuedRollout.from_dict(d)
                    self.queue[q.index] = q
            elif pending is not None:  # the one-step loop's checkpoint: its collected rollout of step `step`
                step = int(pending["step"])
                loss = pending.get("loss") or dataclasses.asdict(self.manager.loss_spec())
                self.queue[step] = QueuedRollout.from_dict({**pending, "index": step, "loss": loss,
                                                            "started_version": step - 1})
                self.taken, self.next_index = step, step + 1
            self.restored = saved is not None or pending is not None

    def resume_at(self, step: int) -> None:
        """The loop starts at `step` with the engines serving version `step`. Without a saved queue (a fresh
        run, or an on-policy run's checkpoint) rollouts are numbered from `step`, drawn from the restored
        data offset."""
        with self._cv:
            if not self.restored:
                self.taken = self.next_index = step
            self.version = max(self.version, step)

    # -- the engine side --------------------------------------------------------------------------
    def sync_weights(self, source: Any, version: int | str) -> dict[str, float]:
        """The trainer's weights as `version`, with the producer's rollout in flight handled as the module
        docstring says. Adds the step's `async/engine_idle_frac` (the share of the step, from asking for
        its batch to the end of this sync, in which no rollout was generating) and `async/trainer_idle_frac`
        (the share the trainer waited for its batch), and `time/sync_wait` (the sync waiting for generation)."""
        t_sync = time.time()
        if self.partial:
            self.manager.pause_generation()
            try:
                sync = self.engine.sync_weights(source, version)
            finally:
                self.manager.resume_generation(int(version))
            with self._cv:
                self.version = max(self.version, int(version))
                self._cv.notify_all()
            waited = 0.0
        else:
            with self._cv:
                if self.drop:
                    self._drained()
                else:  # every rollout the bound lets start at this version, collected: versions stay exact
                    last = self._last_admitted()
                    self._wait(lambda: self.in_flight is None and self.next_index > last)
            waited = time.time() - t_sync
            sync = self.engine.sync_weights(source, version)
        end = time.time()
        return {**sync, "time/sync_wait": waited, **self._idle(end)}

    def _idle(self, end: float) -> dict[str, float]:
        start = self.step_start if self.step_start is not None else end
        span = max(end - start, 1e-9)
        with self._cv:
            intervals = list(self.busy)
            if self.in_flight is not None:  # generating now: busy until now
                intervals.append((self.in_flight_since, end))
            self.busy = [(s, e) for s, e in self.busy if e > start]  # older intervals no longer matter
        busy = sum(max(0.0, min(e, end) - max(s, start)) for s, e in intervals)
        return {"async/engine_idle_frac": min(1.0, max(0.0, 1.0 - busy / span)),
                "async/trainer_idle_frac": min(1.0, self.trainer_wait / span)}


def async_rollouts(config: Any, manager: Any, engine: Any) -> AsyncRollouts:
    """The wrapper for a run's config (`rollout.max_staleness`, `stale_groups`, `partial_rollouts`)."""
    r = config.rollout
    return AsyncRollouts(manager, engine, config.train.steps, r.max_staleness, r.partial_rollouts, r.stale_groups)


__all__ = ["async_rollouts", "AsyncRollouts", "QUEUE_KEY", "PENDING_KEY", "QueuedRollout", "staleness_metrics", "trained_versions"]
