"""AsyncEngine: the (single-threaded) Engine driven by one background thread, fed from asyncio handlers.

The Engine is not thread-safe, so exactly one thread -- the engine thread -- ever calls it:

    event loop(s) --- commands (add / abort) ---> deque + Condition ---> engine thread
                  <-- RequestOutputs via loop.call_soon_threadsafe ---/     loop: run queued commands, then
                                                                           engine.step() while there is work,
                                                                           else sleep on the Condition

``add_request`` is a coroutine: it queues an "add" command with a concurrent Future and awaits it, so the
engine's own errors (EngineFull -> 429, ValueError/TypeError naming the field -> 400) are raised in the caller.
It returns a ``RequestStream`` -- an async iterator of RequestOutputs that ends after the finished one. Each
stream's asyncio.Queue lives on the caller's loop; the engine thread only ever touches it through
``loop.call_soon_threadsafe``. ``abort`` is thread-safe (queued; the engine frees the request's KV blocks on its
thread and the stream ends with finish_reason "abort").

Admission is bounded twice: the engine's own ``max_waiting`` and, here, ``max_waiting`` on the requests queued
but not yet running (commands in flight + the engine's waiting queue). ``begin_drain`` stops admitting
(``EngineDraining``, a server answers 503); ``drain(timeout)`` also waits until every admitted request finished;
``shutdown`` aborts what is left and joins the thread (``drain_blocking``: ``drain`` without an event loop).
``stats()`` is a snapshot the engine thread refreshes after every step (the engine's own ``stats()`` plus steps
and step time), readable from any thread.
If ``engine.step()`` raises, every open stream receives the exception and the AsyncEngine refuses new requests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from collections import deque
from typing import Any

from .types import EngineFull, RequestOutput, SamplingParams


class EngineDraining(RuntimeError):
    """The server is draining or shutting down: no new requests (HTTP 503 + Retry-After)."""

    def __init__(self, message: str, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = float(retry_after_s)


class RequestStream:
    """Async iterator over one request's RequestOutputs (the last one has ``finished`` True)."""

    def __init__(self, owner: AsyncEngine, request_id: str, queue: asyncio.Queue, prompt_len: int = 0) -> None:
        self.owner, self.request_id, self._queue = owner, request_id, queue
        self.prompt_len = prompt_len
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    async def get(self, timeout: float | None = None) -> RequestOutput:
        """The next output, or TimeoutError after ``timeout`` seconds (the request keeps running)."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    def abort(self) -> None:
        if not self.finished:
            self.owner.abort(self.request_id)


class AsyncEngine:
    """One engine thread serving asyncio callers; see the module docstring."""

    def __init__(self, engine: Any, *, max_waiting: int | None = None, idle_wait_s: float = 0.05) -> None:
        for name in ("add_request", "abort", "step", "has_unfinished", "stats"):
            if not callable(getattr(engine, name, None)):
                raise TypeError(f"engine: expected a tinylearn.serve.Engine (needs .{name}()), got {type(engine)}")
        if max_waiting is not None and (isinstance(max_waiting, bool) or not isinstance(max_waiting, int)):
            raise TypeError(f"max_waiting: expected an int >= 1 or None, got {max_waiting!r}")
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting: expected an int >= 1 or None, got {max_waiting!r}")
        self.engine, self.max_waiting, self.idle_wait_s = engine, max_waiting, float(idle_wait_s)
        self._cv = threading.Condition()
        self._cmds: deque[tuple[str, Any, concurrent.futures.Future | None]] = deque()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue, int]] = {}
        self._ids = itertools.count()
        self._draining = False
        self._stop = False
        self._error: BaseException | None = None
        self._busy = False
        self._stats: dict[str, Any] = {**engine.stats(), "steps": 0, "last_step_s": 0.0, "in_flight": 0}
        self._thread = threading.Thread(target=self._run, name="tinylearn-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- caller side (any thread / event loop)
    @property
    def draining(self) -> bool:
        return self._draining or self._stop

    @property
    def error(self) -> BaseException | None:
        return self._error

    def stats(self) -> dict[str, Any]:
        """The latest snapshot (engine.stats() + steps, last_step_s, in_flight); safe from any thread."""
        with self._cv:
            return dict(self._stats)

    def num_in_flight(self) -> int:
        with self._cv:
            return len(self._streams) + sum(1 for c in self._cmds if c[0] == "add")

    async def add_request(
        self, prompt: list[int] | str, params: SamplingParams | None = None, *, request_id: str | None = None, **kw: Any
    ) -> RequestStream:
        """Admit a request (on the engine thread) and return its output stream; raises what the engine raises."""
        loop = asyncio.get_running_loop()
        rid = request_id if request_id is not None else f"req-{next(self._ids)}-{time.monotonic_ns() % 10**9}"
        queue: asyncio.Queue = asyncio.Queue()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            self._check_admit()
            self._cmds.append(("add", (loop, queue, prompt, params, rid, kw), fut))
            self._cv.notify()
        rid, prompt_len = await asyncio.wrap_future(fut)
        return RequestStream(self, rid, queue, prompt_len)

    def _check_admit(self) -> None:  # under self._cv
        if self._error is not None:
            raise EngineDraining(f"engine: stopped after an error in step(): {self._error!r}")
        if self._draining or self._stop:
            raise EngineDraining("server: draining (shutting down); not admitting new requests")
        if self.max_waiting is not None:
            queued = sum(1 for c in self._cmds if c[0] == "add") + int(self._stats.get("waiting", 0))
            if queued >= self.max_waiting:
                raise EngineFull(f"queue: {queued} requests waiting, at max_waiting={self.max_waiting}", 1.0)

    def abort(self, request_id: str) -> None:
        """Queue an abort (thread-safe, non-blocking); the request's stream then ends with finish_reason 'abort'."""
        with self._cv:
            self._cmds.append(("abort", request_id, None))
            self._cv.notify()

    def begin_drain(self) -> None:
        """Stop admitting new requests (they get EngineDraining); admitted ones keep running."""
        with self._cv:
            self._draining = True
            self._cv.notify()

    def _idle(self) -> bool:
        with self._cv:
            return not self._streams and not self._cmds and not self._busy

    async def drain(self, timeout: float = 30.0) -> bool:
        """Stop admitting and wait (without blocking the loop) until in-flight requests finished; True if they did."""
        self.begin_drain()
        deadline = time.monotonic() + float(timeout)
        while not self._idle():
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            await asyncio.sleep(0.01)
        return True

    def drain_blocking(self, timeout: float = 30.0) -> bool:
        """``drain`` for a thread without an event loop (scripts, notebooks): blocks until idle or ``timeout``."""
        self.begin_drain()
        deadline = time.monotonic() + float(timeout)
        while not self._idle():
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            time.sleep(0.01)
        return True

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort what is left (streams end with 'abort'), stop and join the engine thread. Idempotent."""
        with self._cv:
            self._draining = True
            self._stop = True
            self._cv.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---------------------------------------------------------------- engine thread
    def _deliver(self, rid: str, item: Any) -> None:
        entry = self._streams.get(rid)
        if entry is None:
            return
        loop, queue, _ = entry
        if (isinstance(item, RequestOutput) and item.finished) or isinstance(item, BaseException):
            with self._cv:
                self._streams.pop(rid, None)
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening any more
            with self._cv:
                self._streams.pop(rid, None)
            if isinstance(item, RequestOutput) and not item.finished:
                self.engine.abort(rid)

    def _abort_output(self, rid: str) -> RequestOutput:
        plen = self._streams[rid][2] if rid in self._streams else 0
        return RequestOutput(rid, plen, [], [], finished=True, finish_reason="abort")

    def _run_command(self, kind: str, arg: Any, fut: concurrent.futures.Future | None) -> None:
        if kind == "add":
            loop, queue, prompt, params, rid, kw = arg
            if fut is None or not fut.set_running_or_notify_cancel():
                return
            try:
                if self._stop or self._error is not None:
                    raise EngineDraining("server: shutting down; not admitting new requests")
                mw = self.max_waiting
                if mw is not None and int(self.engine.stats().get("waiting", 0)) >= mw:
                    raise EngineFull(f"queue: engine waiting queue at max_waiting={mw}", 1.0)
                rid = self.engine.add_request(prompt, params, request_id=rid, **kw)
            except BaseException as e:  # noqa: BLE001 -- handed to the caller
                fut.set_exception(e)
                return
            plen = len(prompt) if isinstance(prompt, list) else 0
            with self._cv:
                self._streams[rid] = (loop, queue, plen)
            fut.set_result((rid, plen))
        elif kind == "abort":
            if arg in self._streams:
                self.engine.abort(arg)
                self._deliver(arg, self._abort_output(arg))

    def _run(self) -> None:
        eng = self.engine
        has_work = False
        while True:
            with self._cv:
                while not self._cmds and not has_work and not self._stop:
                    self._cv.wait(self.idle_wait_s)
                cmds = list(self._cmds)
                self._cmds.clear()
                stop = self._stop
                self._busy = True
            for kind, arg, fut in cmds:
                self._run_command(kind, arg, fut)
            if stop:
                for rid in list(self._streams):
                    eng.abort(rid)
                    self._deliver(rid, self._abort_output(rid))
                with self._cv:
                    self._busy = False
                return
            t0 = time.perf_counter()
            try:
                ran = bool(eng.has_unfinished())
                outs = eng.step() if ran else []
                has_work = bool(eng.has_unfinished())
            except BaseException as e:  # noqa: BLE001 -- the engine is broken: fail every stream, refuse new work
                with self._cv:
                    self._error = e
                    self._busy = False
                for rid in list(self._streams):
                    self._deliver(rid, RuntimeError(f"engine: step() failed: {e!r}"))
                return
            dt = time.perf_counter() - t0
            for out in outs:
                self._deliver(out.request_id, out)
            snap = eng.stats()
            with self._cv:
                steps = self._stats.get("steps", 0) + int(ran)
                self._stats = {**snap, "steps": steps, "last_step_s": dt, "in_flight": len(self._streams)}
                self._busy = False
