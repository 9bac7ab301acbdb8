"""One worker thread that batches concurrent requests into `engine.generate` calls.

The engine is synchronous PyTorch and not thread-safe, so exactly one thread calls it; the event loop
only submits tickets and awaits their futures (`asyncio.wrap_future`). A ticket can be aborted while it
waits (it is dropped before reaching the engine) or while it runs (`engine.abort` on its wire rid).

Continuous batching: with an engine that accepts admission (`accepts_admission`, the embedded engine), tickets
that arrive while a call runs join it between two decode steps (up to `max_batch` running), and each ticket is
resolved as soon as its request finishes, so short requests do not wait for the batch's longest one.

Weight updates take `exclusive()`: it stops admission, waits for the running `generate` call to end and holds
the worker until the update is applied, so no call ever sees half-updated weights. Every ticket records the
weight version it finished under (`weight_version`, changed only inside `exclusive()`).

SGLang's `/pause_generation` and `/continue_generation` (`pause`, `resume`): while paused no call starts and no
request joins one. `abort` ends every live request with what it generated; `retract` takes the running requests
out of the engine (their tokens kept) and continues them at `resume` from prompt + tokens, their KV recomputed
under the weights of then; `in_place` stops the running call at its next decode step, where it waits with its
KV cache: an update may then take the engine (`exclusive` does not wait for that call), and the call goes on
under the new weights at `resume`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional

from slime_ext.data.generation import GenerateRequest, GenerateResult, continuation_request

log = logging.getLogger(__name__)
PAUSE_MODES = ("abort", "retract", "in_place")  # sglang io_struct.PauseGenerationReqInput.mode


@dataclass(eq=False)
class Ticket:
    request: GenerateRequest
    on_token: Optional[Callable[[int], None]] = None
    future: "Future[GenerateResult]" = field(default_factory=Future)
    wire_rid: Optional[str] = None  # the rid the engine sees (suffixed if another ticket shares it)
    aborted: bool = False
    weight_version: Optional[str] = None  # the weight version it finished under
    submitted: float = field(default_factory=time.monotonic)
    retracting: bool = False  # a retract pause took it out of the engine: its abort result is kept, not returned
    prefix: Optional[GenerateResult] = None  # what it generated before a retract
    resumed: Optional[GenerateRequest] = None  # its continuation after a retract (what the engine runs)
    emitted: int = 0  # tokens the engine emitted for it in the running call
    version_events: list[tuple[str, int]] = field(default_factory=list)  # (old version, tokens made under it)

    def tokens_so_far(self) -> int:
        return (len(self.prefix.output_ids) if self.prefix is not None else 0) + self.emitted


def token_versions(events: list[tuple[str, int]], current: str, n_tokens: int) -> list[str]:
    """One version per output token from the version changes a request lived through (SGLang's
    compute_weight_version_spans): tokens before each change's count are of the old version."""
    out: list[str] = []
    for version, upto in [*events, (current, n_tokens)]:
        upto = min(upto, n_tokens)
        out += [version] * max(0, upto - len(out))
    return out


def merged_result(prefix: GenerateResult, rest: GenerateResult, request: GenerateRequest) -> GenerateResult:
    """A retracted request's answer: its tokens before the retract and after, as one response (the routes are
    the continuation's, recomputed over the whole sequence, as SGLang's are after a retract)."""
    logprobs = None if prefix.logprobs is None or rest.logprobs is None else list(prefix.logprobs) + list(rest.logprobs)
    return replace(rest, rid=request.rid, output_ids=list(prefix.output_ids) + list(rest.output_ids), logprobs=logprobs,
                   annotations=list(prefix.annotations or []) + list(rest.annotations or []),
                   cached_tokens=prefix.cached_tokens, prompt_len=len(request.input_ids))


def aborted_result(request: GenerateRequest) -> GenerateResult:
    return GenerateResult(request.rid, [], [] if request.return_logprob else None, "abort", [], 0,
                          len(request.input_ids))


class Batcher:
    """Collects queued tickets (up to `max_batch`, waiting `window_s` for stragglers) into one call.
    With `settle_s`, the wait restarts after every arrival, for at most `settle_s` in all. With `continuous`
    (and an engine that accepts admission), later tickets join the running call, in groups: once they are
    `admit_min_share` of the running requests or the oldest has waited `admit_max_wait_s`."""

    def __init__(self, engine: Any, max_batch: int = 64, window_s: float = 0.005, weight_version: str = "default",
                 settle_s: Optional[float] = None, continuous: bool = True, admit_min_share: float = 0.125,
                 admit_max_wait_s: float = 0.25):
        self.engine, self.max_batch, self.window_s = engine, int(max_batch), float(window_s)
        self.settle_s = None if settle_s is None else float(settle_s)
        self.weight_version = str(weight_version)
        # tickets join running calls when the engine can take them (off: every call is a static batch)
        self.continuous = bool(continuous) and bool(getattr(engine, "accepts_admission", False))
        # every admission costs a prefill forward besides the decode step: waiting tickets join once they are
        # `admit_min_share` of the running rows, or once the oldest has waited `admit_max_wait_s`
        self.admit_min_share, self.admit_max_wait_s = float(admit_min_share), float(admit_max_wait_s)
        self.queue: "queue.Queue[Optional[Ticket]]" = queue.Queue()
        self.calls = 0
        self._lock = threading.Lock()
        self._engine_lock = threading.Lock()  # held by the worker for each generate call, or by exclusive()
        self._gate = threading.Condition()  # the worker waits here while exclusive sections are pending
        self._exclusive_pending = 0
        self._pending: dict[str, list[Ticket]] = {}  # client rid -> its live tickets
        self._running: dict[str, Ticket] = {}  # wire rid -> ticket, in the running generate call
        self._held: "collections.deque[Ticket]" = collections.deque()  # taken from the queue, could not join
        self.admissions = 0  # tickets that joined a running call
        self._paused: Optional[str] = None  # the pause mode while generation is paused
        self._parked = False  # the running call waits at a decode step (in-place pause)
        self._retracted: list[Ticket] = []  # taken out by a retract pause, continued at resume
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
            running = self._running.get(ticket.wire_rid) is ticket
        if running and hasattr(self.engine, "abort"):
            self.engine.abort(ticket.wire_rid)

    def pause(self, mode: str) -> int:
        """SGLang's /pause_generation (see the module docstring); returns the live requests it touched."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {mode!r}: expected one of {list(PAUSE_MODES)}")
        if mode == "in_place" and not self.continuous:
            raise ValueError("pause mode 'in_place' needs continuous batching (an engine that stops between decode "
                             "steps); use 'retract' or 'abort'")
        with self._gate:
            self._paused = mode
            self._gate.notify_all()
        if mode == "abort":
            return self.abort_all()
        with self._lock:
            running = list(self._running.values())
            if mode == "retract":
                for t in running:
                    t.retracting = True
        if mode == "retract" and hasattr(self.engine, "abort"):
            for t in running:
                self.engine.abort(t.wire_rid)
        return len(running)

    def resume(self) -> None:
        """SGLang's /continue_generation: the parked call goes on, retracted requests are queued again."""
        with self._gate:
            self._paused = None
            retracted, self._retracted = self._retracted, []
            self._gate.notify_all()
        for t in retracted:
            self.queue.put(t)

    @property
    def paused(self) -> Optional[str]:
        return self._paused

    def set_weight_version(self, version: str) -> None:
        """Inside `exclusive()`: the served weights are now `version`. A request that lives through the change
        (parked in place, or retracted) records how many of its tokens the old version made: a parked one's
        next token too, which the engine samples from the logits it computed before it parked."""
        with self._lock:
            pending = 1 if self._parked else 0
            for t in self._running.values():
                t.version_events.append((self.weight_version, t.tokens_so_far() + pending))
            for t in self._retracted:
                t.version_events.append((self.weight_version, t.tokens_so_far()))
            self.weight_version = str(version)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The engine to the caller alone: waits for the running generate call to end (or to park at an
        in-place pause) and keeps new ones from starting until the block ends (blocking: call it off the
        event loop)."""
        with self._gate:
            self._exclusive_pending += 1
        locked = False
        try:
            while not locked:
                locked = self._engine_lock.acquire(timeout=0.05)
                with self._gate:
                    if not locked and self._parked:  # the call waits at a step boundary until we are done
                        break
            yield
        finally:
            if locked:
                self._engine_lock.release()
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
            first = self._held.popleft() if self._held else self.queue.get()
            if first is None:
                return
            items = [first]
            while self._held and len(items) < self.max_batch:
                items.append(self._held.popleft())
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
            with self._gate:  # an update is waiting or applying, or generation is paused: let it go first
                self._gate.wait_for(lambda: (not self._exclusive_pending and self._paused is None)
                                    or self._stop.is_set())
            with self._engine_lock:
                self._run(items)

    def _start(self, items: list[Ticket]) -> list[Ticket]:
        """Drop aborted tickets, give the rest wire rids unique in the running call and mark them running."""
        live = []
        with self._lock:
            for t in items:
                if t.aborted:
                    self._finish(t, aborted_result(t.request))
                    continue
                rid, k = t.request.rid, 0
                while rid in self._running:  # rids must be unique within one generate call
                    k += 1
                    rid = f"{t.request.rid}#{k}"
                t.wire_rid = rid
                t.emitted = 0
                self._running[rid] = t
                live.append(t)
        return live

    @staticmethod
    def _wire_request(ticket: Ticket) -> GenerateRequest:
        req = ticket.resumed or ticket.request
        return req if ticket.wire_rid == req.rid else replace(req, rid=ticket.wire_rid)

    def _admit(self, can_join: Callable[[GenerateRequest], bool]) -> list[GenerateRequest]:
        """Called by the engine between decode steps: the queued tickets that can join the running call (up to
        `max_batch` running); none while a weight update waits. The others are held for the next call."""
        if self._paused == "in_place":
            self._park()
            return []
        if self._exclusive_pending or self._paused is not None or self._stop.is_set():
            return []
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._stop.set()
                break
            self._held.append(item)
        if not self._held or not self._admission_due():
            return []
        room = self.max_batch - len(self._running)
        joining, kept = [], collections.deque()
        while self._held:
            t = self._held.popleft()
            if len(joining) < room and (t.aborted or can_join(t.request)):
                joining.append(t)
            else:
                kept.append(t)
        self._held = kept
        live = self._start(joining)
        self.admissions += len(live)
        return [self._wire_request(t) for t in live]

    def _park(self) -> None:
        """In-place pause: the running call waits here, between two decode steps, until generation continues
        and no update is applying (an update may take the engine meanwhile: `exclusive`)."""
        with self._gate:
            self._parked = True
            self._gate.notify_all()
            self._gate.wait_for(lambda: (self._paused != "in_place" and not self._exclusive_pending)
                                or self._stop.is_set())
            self._parked = False

    def _admission_due(self) -> bool:
        running = len(self._running)  # finished tickets leave it at once (_finish_wire)
        waited = time.monotonic() - self._held[0].submitted
        return len(self._held) >= self.admit_min_share * running or waited >= self.admit_max_wait_s

    def _finish_wire(self, result: GenerateResult) -> None:
        """The engine finished one request of the running call: resolve its ticket now."""
        with self._lock:
            ticket = self._running.pop(result.rid, None)
            if ticket is not None:
                self._finish(ticket, replace(result, rid=ticket.request.rid))

    def _retracted_result(self, ticket: Ticket, result: GenerateResult) -> bool:
        """A retract pause's abort of `ticket`: keep what it generated and continue it at resume (or now, if
        generation already continued). False when the ticket finishes as it is (budget spent, not retracted)."""
        if not ticket.retracting or result.finish_reason != "abort":
            return False
        ticket.retracting = False
        prefix = result if ticket.prefix is None else merged_result(ticket.prefix, result, ticket.request)
        follow = continuation_request(ticket.request, prefix.output_ids)
        if follow is None:
            return False
        ticket.prefix, ticket.resumed, ticket.emitted = prefix, follow, 0  # its tokens so far are the prefix's
        with self._gate:
            if self._paused is not None:
                self._retracted.append(ticket)
                return True
        self.queue.put(ticket)
        return True

    def _finish(self, ticket: Ticket, result: Optional[GenerateResult] = None,
                error: Optional[BaseException] = None) -> None:
        """Resolve a ticket (caller holds the lock or is the only thread touching it)."""
        if result is not None:
            if self._retracted_result(ticket, result):
                return
            if ticket.prefix is not None:  # a retracted request's rest: one response with its first part
                result = merged_result(ticket.prefix, result, ticket.request)
            ticket.weight_version = self.weight_version
            result = replace(result, token_versions=token_versions(ticket.version_events, self.weight_version,
                                                                   len(result.output_ids)))
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
        requests = [self._wire_request(t) for t in live]

        def on_token(rid: str, tok: int) -> None:
            ticket = self._running.get(rid)
            if ticket is not None:
                ticket.emitted += 1
            if ticket is not None and ticket.on_token is not None:
                try:
                    ticket.on_token(tok)
                except Exception:  # noqa: BLE001 - a broken stream must not stop the batch
                    log.exception("streaming callback for %s failed", rid)

        self.calls += 1
        streaming = self.continuous or any(t.on_token is not None for t in live)
        kwargs = {"admit": self._admit, "on_finish": self._finish_wire} if self.continuous else {}
        try:
            results = self.engine.generate(requests, on_token=on_token if streaming else None, **kwargs)
            error = None
        except Exception as exc:  # noqa: BLE001 - every waiting client gets the error
            log.exception("engine.generate failed for a batch of %d", len(self._running))
            results, error = [], exc
        with self._lock:
            running, self._running = self._running, {}
            for res in results:  # results the engine did not hand over one by one
                ticket = running.pop(res.rid, None)
                if ticket is not None:
                    self._finish(ticket, replace(res, rid=ticket.request.rid))
            for ticket in running.values():  # no result: the call failed (or the engine lost it)
                self._finish(ticket, None, error or RuntimeError(f"the engine returned no result for {ticket.wire_rid}"))
