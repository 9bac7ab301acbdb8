"""One worker thread that batches concurrent requests into `engine.generate` calls.

The engine is synchronous PyTorch and not thread-safe, so exactly one thread calls it; the event loop
only submits tickets and awaits their futures (`asyncio.wrap_future`). A ticket can be aborted while it
waits (it is dropped before reaching the engine) or while it runs (`engine.abort` on its wire rid).

Weight updates take `exclusive()`: it waits for the running `generate` call to end and holds the worker
until the update is applied, so no call ever sees half-updated weights. Every ticket records the weight
version its call ran under (`weight_version`, changed only inside `exclusive()`).
"""

from __future__ import annotations

import logging
import contextlib
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

from slime_ext.data.generation import GenerateRequest, GenerateResult

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Ticket:
    request: GenerateRequest
    on_token: Optional[Callable[[int], None]] = None
    future: "Future[GenerateResult]" = field(default_factory=Future)
    wire_rid: Optional[str] = None  # the rid the engine sees (suffixed if another ticket shares it)
    aborted: bool = False
    weight_version: Optional[str] = None  # the weight version of the generate call that ran it


def aborted_result(request: GenerateRequest) -> GenerateResult:
    return GenerateResult(request.rid, [], [] if request.return_logprob else None, "abort", [], 0,
                          len(request.input_ids))


class Batcher:
    """Collects queued tickets (up to `max_batch`, waiting `window_s` for stragglers) into one call.
    With `settle_s`, the wait restarts after every arrival, for at most `settle_s` in all."""

    def __init__(self, engine: Any, max_batch: int = 64, window_s: float = 0.005, weight_version: str = "default",
                 settle_s: Optional[float] = None):
        self.engine, self.max_batch, self.window_s = engine, int(max_batch), float(window_s)
        self.settle_s = None if settle_s is None else float(settle_s)
        self.weight_version = str(weight_version)
        self.queue: "queue.Queue[Optional[Ticket]]" = queue.Queue()
        self.calls = 0
        self._lock = threading.Lock()
        self._engine_lock = threading.Lock()  # held by the worker for each generate call, or by exclusive()
        self._gate = threading.Condition()  # the worker waits here while exclusive sections are pending
        self._exclusive_pending = 0
        self._pending: dict[str, list[Ticket]] = {}  # client rid -> its live tickets
        self._running: list[Ticket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="serve-batcher", daemon=True)
        self._thread.start()

    # -- the event loop's side ----------------------------------------------------------------------
    def submit(self, request: GenerateRequest, on_token: Optional[Callable[[int], None]] = None) -> Ticket:
        ticket = Ticket(request, on_token)
        with self._lock:
            self._pending.setdefault(request.rid, []).append(ticket)
        self.queue.put(ticket)
        return ticket

    def abort(self, rid: str) -> int:
        """Abort every live request with client rid `rid`; returns how many were found."""
        with self._lock:
            tickets = list(self._pending.get(rid, []))
        for t in tickets:
            self.abort_ticket(t)
        return len(tickets)

    def abort_all(self) -> int:
        with self._lock:
            tickets = [t for ts in self._pending.values() for t in ts]
        for t in tickets:
            self.abort_ticket(t)
        return len(tickets)

    def abort_ticket(self, ticket: Ticket) -> None:
        """Queued: it never reaches the engine. Running: the engine stops it at its next step."""
        with self._lock:
            ticket.aborted = True
            running = ticket in self._running
        if running and hasattr(self.engine, "abort"):
            self.engine.abort(ticket.wire_rid)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The engine to the caller alone: waits for the running generate call to end and keeps new
        ones from starting until the block ends (blocking: call it off the event loop)."""
        with self._gate:
            self._exclusive_pending += 1
        try:
            with self._engine_lock:
                yield
        finally:
            with self._gate:
                self._exclusive_pending -= 1
                self._gate.notify_all()

    def close(self) -> None:
        self._stop.set()
        self.queue.put(None)
        with self._gate:
            self._gate.notify_all()
        self._thread.join(timeout=10)

    # -- the worker thread --------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            first = self.queue.get()
            if first is None:
                return
            items = [first]
            start = time.monotonic()
            deadline = start + self.window_s
            while len(items) < self.max_batch:
                try:
                    item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._stop.set()
                    break
                items.append(item)
                if self.settle_s is not None:  # a burst is still arriving: keep collecting it
                    deadline = min(start + self.settle_s, time.monotonic() + self.window_s)
            with self._gate:  # an update is waiting or applying: let it go first
                self._gate.wait_for(lambda: not self._exclusive_pending or self._stop.is_set())
            with self._engine_lock:
                self._run(items)

    def _start(self, items: list[Ticket]) -> list[Ticket]:
        """Drop aborted tickets, give the rest unique wire rids and mark them running."""
        live, seen = [], set()
        with self._lock:
            for t in items:
                if t.aborted:
                    self._finish(t, aborted_result(t.request))
                    continue
                rid, k = t.request.rid, 0
                while rid in seen:  # rids must be unique within one generate call
                    k += 1
                    rid = f"{t.request.rid}#{k}"
                seen.add(rid)
                t.wire_rid = rid
                live.append(t)
            self._running = live
        return live

    def _finish(self, ticket: Ticket, result: Optional[GenerateResult] = None,
                error: Optional[BaseException] = None) -> None:
        """Resolve a ticket (caller holds the lock or is the only thread touching it)."""
        tickets = self._pending.get(ticket.request.rid, [])
        if ticket in tickets:
            tickets.remove(ticket)
            if not tickets:
                del self._pending[ticket.request.rid]
        if ticket.future.done():
            return
        if error is not None:
            ticket.future.set_exception(error)
        else:
            ticket.future.set_result(result)

    def _run(self, items: list[Ticket]) -> None:
        live = self._start(items)
        if not live:
            return
        requests = [t.request if t.wire_rid == t.request.rid else replace(t.request, rid=t.wire_rid) for t in live]
        callbacks = {t.wire_rid: t.on_token for t in live if t.on_token is not None}

        def on_token(rid: str, tok: int) -> None:
            cb = callbacks.get(rid)
            if cb is not None:
                try:
                    cb(tok)
                except Exception:  # noqa: BLE001 - a broken stream must not stop the batch
                    log.exception("streaming callback for %s failed", rid)

        self.calls += 1
        version = self.weight_version
        for t in live:
            t.weight_version = version
        try:
            results = self.engine.generate(requests, on_token=on_token if callbacks else None)
            error = None
        except Exception as exc:  # noqa: BLE001 - every waiting client gets the error
            log.exception("engine.generate failed for a batch of %d", len(requests))
            results, error = [None] * len(live), exc
        with self._lock:
            self._running = []
            for t, res in zip(live, results):
                if res is not None and res.rid != t.request.rid:
                    res = replace(res, rid=t.request.rid)
                self._finish(t, res, error)
