"""Reliability runs (issue 16): soak, fuzz, concurrency and shutdown, in a long form
(``make soak``, this module's CLI) and a short form (tests/test_reliability.py).

Why one module: the tests and ``make soak`` run the same code at two lengths, so a figure
in docs/reliability.md is what the tests check, only longer.

What every run counts, for docs/design.md's "every request is answered exactly once"
(:class:`Ledger`):

* ``submitted``, ``ok``, typed errors by ``code`` (AvInferError subclasses);
* ``lost``: requests whose future was still unanswered (its done-callback never ran) when
  the run ended, after draining, with a generous hang guard;
* ``duplicated``: a request the scheduler answered twice (its ``complete``/``fail``
  listener events, one per answer, counted per request id);
* ``untyped``: a future failed with something other than an AvInferError, and
  ``submit_raised``: ``submit`` raised instead of returning a failed future (both bugs).

Waits are hang guards, never measurements: nothing here asserts a duration.

CLI: ``python -m av_infer.bench.soak --minutes 10`` (``make soak``) runs a DISB-E-like
soak on ``cpu`` (rates scaled to the machine) and on ``sim`` (virtual time) for the given
minutes each, then the long forms of fuzz (10,000 requests), concurrency (100 rounds) and
shutdown (100 rounds per mode); prints a table and writes JSON (``--json -``: stdout).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from av_infer.errors import AvInferError, RuntimeClosedError
from av_infer.sched.request import Result

__all__ = ["HANG_S", "Ledger", "concurrency", "fuzz", "main", "rss_bytes", "shutdown", "soak"]

#: Hang guard (seconds) of every wait: past it a request counts as lost, a thread as hung.
HANG_S = 60.0
#: DISB workload E (5 RT Poisson clients at 20 req/s, 5 BE closed loops), zoo "scaled".
WORKLOAD = "E"
#: Default open-loop rate factor per device: the cpu one leaves a shared 2-core VM room.
RATE_SCALE = {"cpu": 0.5, "sim": 1.0}


# -- counting answers -------------------------------------------------------------------------
class Ledger:
    """Counts requests and their answers (see the module docstring). Thread-safe.

    Submit through :meth:`submit` (never raises; a raising ``Runtime.submit`` is counted)
    and :meth:`watch` every runtime for duplicate detection."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self.submitted = 0
        self.ok = 0
        self.errors: Counter[str] = Counter()
        self.untyped = 0
        self.submit_raised = 0
        self.duplicated = 0
        self.open = 0
        self.samples: list[str] = []  # first few bug reports (untyped, raised, duplicated)

    def _sample(self, what: str) -> None:
        if len(self.samples) < 10:
            self.samples.append(what)

    def watch(self, rt: Any) -> None:
        """Count ``rt``'s answers per request id (its ``complete``/``fail`` listener events,
        one per answer); request ids are per runtime, so each runtime gets its own."""
        seen = bytearray()

        def listener(event: str, payload: dict) -> None:
            nonlocal seen
            if event not in ("complete", "fail"):
                return
            rid = int(payload["request_id"])
            with self._cv:
                if rid >= len(seen):
                    seen.extend(bytes(max(rid + 1 - len(seen), 4096)))
                if seen[rid]:
                    self.duplicated += 1
                    self._sample(f"duplicated: request {rid} answered again ({event})")
                else:
                    seen[rid] = 1

        rt.add_listener(listener)

    def submit(self, rt: Any, model: Any, inputs: Any,
               on_done: Callable[[cf.Future], None] | None = None, **kw: Any) -> cf.Future | None:
        """``rt.submit(model, inputs, **kw)``, counted; None if submit raised (a bug)."""
        with self._cv:
            self.submitted += 1
            self.open += 1
        try:
            fut = rt.submit(model, inputs, **kw)
        except Exception as e:  # noqa: BLE001 - counted: submit must never raise
            with self._cv:
                self.open -= 1
                self.submit_raised += 1
                self._sample(f"submit raised {type(e).__name__}: {e} "
                             f"(model={model!r}, kw={_short(kw)})")
                self._cv.notify_all()
            return None
        fut.add_done_callback(lambda f: self._done(f, on_done))
        return fut

    def _done(self, f: cf.Future, on_done: Callable[[cf.Future], None] | None) -> None:
        exc = f.exception()
        with self._cv:
            self.open -= 1
            if exc is None:
                if isinstance(f.result(), Result):
                    self.ok += 1
                else:
                    self.untyped += 1
                    self._sample(f"result of type {type(f.result()).__name__}")
            elif isinstance(exc, AvInferError):
                self.errors[exc.code] += 1
            else:
                self.untyped += 1
                self._sample(f"untyped error {type(exc).__name__}: {exc}")
            self._cv.notify_all()
        if on_done is not None:
            on_done(f)

    def wait_idle(self, timeout: float = HANG_S) -> bool:
        """Wait until every counted request was answered (False: the guard ran out)."""
        with self._cv:
            return self._cv.wait_for(lambda: self.open <= 0, timeout)

    @property
    def answered(self) -> int:
        return self.ok + sum(self.errors.values()) + self.untyped

    def summary(self) -> dict[str, Any]:
        with self._cv:
            return {"requests": self.submitted, "ok": self.ok, "lost": self.open,
                    "duplicated": self.duplicated, "untyped": self.untyped,
                    "submit_raised": self.submit_raised,
                    "errors": dict(sorted(self.errors.items())),
                    "samples": list(self.samples)}


def _short(kw: dict) -> str:
    s = repr({k: v for k, v in kw.items()})
    return s if len(s) < 200 else s[:200] + "..."


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# -- soak: a DISB-E-like mix for a while ----------------------------------------------------------
def _models(variant: str = "scaled") -> tuple[list[tuple[str, str, bool, float]], dict]:
    """DISB-E's clients as (client, zoo model, rt, rate) and each model's sample inputs."""
    from av_infer.bench.workload import load_workload
    from av_infer.model import zoo

    w = load_workload(WORKLOAD)
    clients = [(t.id, t.model, t.rt, t.frequency) for t in w.tasks]
    xs = {m: zoo.sample_inputs(m, variant) for m in w.models}
    return clients, xs


def soak(device: str = "cpu", seconds: float = 600.0, rate_scale: float | None = None,
         seed: int = 0, warmup_frac: float = 0.1, progress: Callable[[float, dict], None] | None
         = None, policy: str = "reef") -> dict[str, Any]:
    """Run DISB-E (RT Poisson clients with a relative deadline of 5 periods, dropping late
    work; BE closed loops) on ``device`` for ``seconds`` of wall time, then drain. Returns
    the ledger's counts plus RSS after warm-up and at the end (``rss_growth``)."""
    from av_infer import Runtime
    from av_infer.model import zoo

    if device not in ("cpu", "sim"):
        raise ValueError(f"soak runs on cpu or sim, got {device!r}")
    scale = RATE_SCALE[device] if rate_scale is None else float(rate_scale)
    clients, xs = _models()
    ledger = Ledger()
    rng = np.random.default_rng(seed)
    rt = Runtime(device, policy=policy)
    ledger.watch(rt)
    t_wall0 = time.monotonic()
    for m in xs:
        rt.load_model(m, zoo.path(m, "scaled"), pin=any(c[1] == m and c[2] for c in clients))
    for cid, _m, is_rt, rate in clients:
        if is_rt:
            rt.configure_client(cid, "RT", relative_deadline=5.0 / (rate * scale),
                                drop_late=True)
        else:
            rt.configure_client(cid, "BE")
    stop = threading.Event()

    def closed_loop(cid: str, m: str) -> Callable[[cf.Future], None]:
        def again(_f: cf.Future) -> None:
            if not stop.is_set():
                ledger.submit(rt, m, xs[m], on_done=again, client=cid)
        return again

    rss0: int | None = None
    trace: list[tuple[float, float]] = []  # (seconds, RSS MB), every tenth of the run
    warm = warmup_frac * seconds
    deadline = t_wall0 + seconds
    rts = [(cid, m, rate * scale) for cid, m, is_rt, rate in clients if is_rt]
    for cid, m, is_rt, _ in clients:
        if not is_rt:
            ledger.submit(rt, m, xs[m], on_done=closed_loop(cid, m), client=cid)
    try:
        if device == "sim":
            dev = rt.device
            chunk = 0.25  # virtual seconds of arrivals per step
            t_v = dev.now()
            while time.monotonic() < deadline:
                for cid, m, rate in rts:
                    t = t_v
                    while True:
                        t += float(rng.exponential(1.0 / rate))
                        if t >= t_v + chunk:
                            break
                        dev.call_at(t, lambda m=m, cid=cid: ledger.submit(
                            rt, m, xs[m], client=cid))
                t_v += chunk
                dev.run(until=t_v)
                el = time.monotonic() - t_wall0
                if rss0 is None and el >= warm:
                    rss0 = rss_bytes()
                if el >= len(trace) * seconds / 10:
                    trace.append((round(el, 1), round(rss_bytes() / 2**20, 1)))
                if progress is not None:
                    progress(min(1.0, el / seconds), ledger.summary())
            stop.set()
            dev.run()
        else:
            heap = [(time.monotonic() + float(rng.exponential(1.0 / r)), i)
                    for i, (_, _, r) in enumerate(rts)]
            last = 0.0
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                i = min(range(len(heap)), key=lambda j: heap[j][0])
                t_next, _ = heap[i]
                if t_next > now:
                    time.sleep(min(t_next - now, 0.05))
                    continue
                cid, m, r = rts[i]
                ledger.submit(rt, m, xs[m], client=cid)
                heap[i] = (t_next + float(rng.exponential(1.0 / r)), i)
                el = now - t_wall0
                if rss0 is None and el >= warm:
                    rss0 = rss_bytes()
                if el >= len(trace) * seconds / 10:
                    trace.append((round(el, 1), round(rss_bytes() / 2**20, 1)))
                if progress is not None and now - last >= 0.5:
                    last = now
                    progress(min(1.0, el / seconds), ledger.summary())
            stop.set()
        drained = ledger.wait_idle(HANG_S)
        stats = rt.stats()
    finally:
        stop.set()
        rt.close(drain=False)
    rss1 = rss_bytes()
    out = ledger.summary()
    rss0 = rss0 or rss1
    out.update({
        "device": device, "policy": policy, "workload": WORKLOAD, "rate_scale": scale,
        "seconds": round(time.monotonic() - t_wall0, 1), "drained": drained,
        "rss_start_mb": round(rss0 / 2**20, 1), "rss_end_mb": round(rss1 / 2**20, 1),
        "rss_growth": round((rss1 - rss0) / rss0, 4) if rss0 else None,
        "rss_trace_mb": trace,
        "deadline_misses": sum(c.get("deadline_misses", 0)
                               for c in stats.get("clients", {}).values()),
        "handler_errors": stats.get("handler_errors", {}),
    })
    if device == "sim":
        out["virtual_seconds"] = round(float(rt.device.now()), 2)
    return out


# -- fuzz: random requests through Runtime.submit ---------------------------------------------
FUZZ_MODELS = {"a": "tiny_cnn", "b": "tiny_mlp"}
_DTYPES = ["float32", "float64", "float16", "int64", "int32", "uint8", "bool", "complex64",
           "object", "<U3"]


def _strategies() -> Any:
    """A hypothesis strategy of ``submit`` keyword arguments: valid requests and every
    kind of wrong one (see tests/test_reliability.py)."""
    from hypothesis import strategies as st

    from av_infer.model import zoo

    specs = {n: {k: v.shape for k, v in zoo.sample_inputs(m).items()}
             for n, m in FUZZ_MODELS.items()}
    dims = st.integers(0, 70)
    shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)
    odd = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.floats(),
                    st.lists(st.floats(), max_size=4), st.just(object()),
                    st.just(np.float32(1.0)), st.just(np.zeros(())))

    @st.composite
    def array(draw: Any, shape: tuple[int, ...] | None = None) -> Any:
        kind = draw(st.sampled_from(["exact"] * 8 + ["dtype", "shape", "odd", "strided",
                                                     "big", "special"]))
        want = shape if shape is not None else draw(shapes)
        if kind == "odd":
            return draw(odd)
        if kind == "shape":
            want = draw(shapes)
        if kind == "big":  # sizes up to the limit of what a test host holds comfortably
            want = (1, 3, 512, 512) if draw(st.booleans()) else tuple(want) + (1024,)
        dt = "float32" if kind not in ("dtype",) else draw(st.sampled_from(_DTYPES))
        n = int(np.prod(want)) if want else 1
        if n > 4_000_000:
            want, n = (4,), 4
        if dt == "object":
            arr = np.empty(want, dtype=object)
        elif dt == "<U3":
            arr = np.full(want, "abc")
        else:
            arr = np.zeros(want, dtype=dt)
        if kind == "special" and arr.size and arr.dtype.kind == "f":
            arr.flat[:3] = [np.nan, np.inf, -np.inf][: min(3, arr.size)]
        elif kind == "strided" and arr.ndim and arr.shape[-1] > 1:
            arr = np.zeros(want[:-1] + (want[-1] * 2,), dtype=dt)[..., ::2]
        return arr

    @st.composite
    def inputs(draw: Any, model: Any) -> Any:
        spec = specs.get(model) if isinstance(model, str) else None
        kind = draw(st.sampled_from(["valid"] * 6 + ["missing", "extra", "renamed",
                                                      "not_mapping", "random"]))
        if spec is None or kind == "random":
            return draw(st.dictionaries(st.text(max_size=6), array(), max_size=3))
        if kind == "not_mapping":
            return draw(st.one_of(odd, array(), st.lists(array(), max_size=2)))
        d = {n: draw(array(sh)) for n, sh in spec.items()}
        if kind == "missing":
            d.pop(next(iter(d)))
        elif kind == "extra":
            d[draw(st.text(min_size=1, max_size=6))] = draw(array())
        elif kind == "renamed":
            d = {n + "_": v for n, v in d.items()}
        return d

    def mostly(valid: Any, weird: Any) -> Any:
        """``valid`` seven times in ten, else ``weird``."""
        return st.integers(0, 9).flatmap(lambda i: valid if i < 7 else weird)

    floats = st.floats(allow_nan=True, allow_infinity=True)
    prio = mostly(st.sampled_from(["RT", "BE", "rt", " be ", 0, 1]),
                  st.one_of(st.sampled_from(["x", "", 2, -1, 3.5, True]), floats,
                            st.integers(), st.text(max_size=4)))
    when = mostly(st.one_of(st.floats(0, 1e4), st.just(math.inf)),
                  st.one_of(floats, st.integers(-10, 10**6), st.text(max_size=4),
                            st.just(np.float64(np.nan)), st.just(-math.inf)))
    arrival = mostly(st.floats(0, 1e4), st.one_of(floats, st.text(max_size=4)))
    client = mostly(st.sampled_from(["default", "cam", "dms", "log"]),
                    st.one_of(st.text(max_size=12), st.none(), st.integers(), st.just("")))
    model = mostly(st.sampled_from(list(FUZZ_MODELS)),
                   st.one_of(st.just("nope"), st.text(max_size=4), st.none(), st.integers()))
    drop = mostly(st.one_of(st.none(), st.booleans()),
                  st.one_of(st.integers(), st.text(max_size=2), st.just(np.bool_(True))))

    @st.composite
    def request(draw: Any) -> dict[str, Any]:
        m = draw(model)
        kw: dict[str, Any] = {"model": m, "inputs": draw(inputs(m))}
        for key, strat in (("priority", prio), ("deadline", when), ("client", client),
                           ("arrival", arrival), ("drop_late", drop)):
            if draw(st.booleans()):
                kw[key] = draw(strat)
        return kw

    return request()


def fuzz(examples: int = 1000, device: str = "sim", seed: int | None = 0,
         strict: bool = True) -> dict[str, Any]:
    """``examples`` hypothesis-generated requests through ``Runtime.submit`` on one runtime
    (``seed`` None: a random run; else the same requests for the same seed). Each must be
    answered exactly once, with a Result or an AvInferError, and submit must not raise;
    afterwards the runtime still serves a valid request. ``strict``: raise AssertionError
    (hypothesis's shrunk falsifying example) on the first violation; else count every
    violation (``submit_raised``, ``untyped``, ``problems``) and go on (the long form)."""
    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import seed as hypothesis_seed

    from av_infer import Runtime
    from av_infer.model import zoo

    ledger = Ledger()
    problems: list[str] = []
    rt = Runtime(device)
    ledger.watch(rt)

    def check(ok: bool, what: str) -> bool:
        if ok:
            return True
        if strict:
            raise AssertionError(what)
        problems.append(what)
        return False

    try:
        for n, m in FUZZ_MODELS.items():
            rt.load_model(n, zoo.path(m))
        virtual = bool(getattr(rt.device, "virtual", False))

        x = zoo.sample_inputs(FUZZ_MODELS["a"])
        edges = [{"priority": math.inf}, {"priority": -math.inf}, {"priority": math.nan},
                 {"priority": 10**30}, {"deadline": math.nan}, {"deadline": -math.inf},
                 {"arrival": math.inf}, {"arrival": math.nan}, {"client": None},
                 {"drop_late": "yes"}, {"deadline": 0.0, "drop_late": True}]

        @settings(max_examples=examples, deadline=None, database=None,
                  print_blob=True,
                  suppress_health_check=list(HealthCheck))
        @given(_strategies())
        def one(kw: dict[str, Any]) -> None:
            kw = dict(kw)
            model, inputs = kw.pop("model"), kw.pop("inputs")
            fut = ledger.submit(rt, model, inputs, **kw)
            if not check(fut is not None, ledger.samples[-1] if ledger.samples else "raised"):
                return
            calls: list[int] = []
            fut.add_done_callback(lambda f: calls.append(1))
            if virtual:
                rt.device.run()
            done, _ = cf.wait([fut], timeout=HANG_S)
            if not check(bool(done), f"hang guard: unanswered after {HANG_S} s "
                                     f"(model={model!r}, kw={_short(kw)})"):
                return
            exc = fut.exception()
            check(exc is None or isinstance(exc, AvInferError),
                  f"untyped {type(exc).__name__}: {exc} (model={model!r}, kw={_short(kw)})")
            # the done-callback runs once, on the callback thread (cpu): hang guard only
            t_end = time.monotonic() + HANG_S
            while not calls and time.monotonic() < t_end:
                time.sleep(0.0005)
            check(len(calls) == 1, f"done-callback ran {len(calls)} times")

        for e in edges:  # known edges first, then what hypothesis draws
            one = example({"model": "a", "inputs": x, **e})(one)
        if seed is not None:  # the same requests for the same seed
            one = hypothesis_seed(seed)(one)
        one()
        # still serving
        fut = ledger.submit(rt, "a", zoo.sample_inputs(FUZZ_MODELS["a"]))
        if virtual:
            rt.device.run()
        assert fut is not None and isinstance(fut.result(timeout=HANG_S), Result)
        assert ledger.wait_idle(HANG_S)
        stats = rt.stats()
    finally:
        rt.close(drain=False)
    out = ledger.summary()
    out.update({"device": device, "examples": examples, "problems": problems[:10],
                "problem_count": len(problems),
                "submit_errors": stats.get("submit_errors", {}),
                "handler_errors": stats.get("handler_errors", {})})
    if out["duplicated"] and strict:
        raise AssertionError(f"duplicated answers: {out['samples']}")
    return out


# -- concurrency: every public call from many threads at once --------------------------------
def _plans(device: str) -> dict[str, Any]:
    """Compiled plans of the fuzz models (loading a ready Plan costs no compile)."""
    from av_infer.devices import make_device
    from av_infer.model import zoo

    dev = make_device(device)
    try:
        return {n: dev.compile(zoo.path(m), name=n) for n, m in FUZZ_MODELS.items()}
    finally:
        dev.close()


def _join(threads: Sequence[threading.Thread], timeout: float = HANG_S) -> list[str]:
    """Join with a hang guard; the names of threads still alive."""
    end = time.monotonic() + timeout
    for th in threads:
        th.join(max(0.0, end - time.monotonic()))
    return [th.name for th in threads if th.is_alive()]


def concurrency_round(device: str, plans: dict, ledger: Ledger, seed: int,
                      submits: int = 20) -> dict[str, Any]:
    """One round: submitters, set_policy (and the queue depth and BE share setters),
    set_c, load/unload, stats and close, all at once on a fresh runtime. Returns the typed
    error codes the calls raised, the untyped errors and the hung threads."""
    from av_infer import POLICIES, Runtime
    from av_infer.model import zoo

    rng = random.Random(seed)
    rt = Runtime(device, c=2, max_be_streams=2)
    ledger.watch(rt)
    rt.load_model("a", plans["a"])
    rt.load_model("b", plans["b"])
    xs = {n: zoo.sample_inputs(m) for n, m in FUZZ_MODELS.items()}
    typed: Counter[str] = Counter()
    untyped: list[str] = []
    lock = threading.Lock()
    go = threading.Barrier(8, timeout=HANG_S)
    policies = list(POLICIES) + ["nope"]

    def call(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except AvInferError as e:
            with lock:
                typed[e.code] += 1
        except Exception as e:  # noqa: BLE001 - counted: only typed errors are allowed
            with lock:
                untyped.append(f"{type(e).__name__}: {e}")

    def worker(ops: list[Callable[[], Any]]) -> None:
        go.wait()
        for op in ops:
            call(op)

    def sub(i: int) -> Callable[[], Any]:
        m = rng.choice("ab")
        prio = rng.choice(["RT", "BE"])
        return lambda: ledger.submit(rt, m, xs[m], priority=prio, client=f"c{i % 3}")

    def set_c() -> Callable[[], Any]:
        c = rng.choice([1, 2, 3, 4, 0, 99])
        return lambda: rt.set_c(c)

    def set_policy() -> Callable[[], Any]:
        p = rng.choice(policies)
        return lambda: rt.set_policy(p)

    def set_depth() -> Callable[[], Any]:
        d = rng.choice([None, 1, 4, 0, -1])
        return lambda: rt.set_max_queue_depth(d)

    def set_share() -> Callable[[], Any]:
        x = rng.choice([0.0, 0.1, 0.5, 1.5, float("nan")])
        return lambda: rt.set_be_min_share(x)

    def load() -> Callable[[], Any]:
        m = rng.choice(["m", "a"])
        return lambda: rt.load_model(m, plans[rng.choice("ab")])

    def unload() -> Callable[[], Any]:
        return lambda: rt.unload_model(rng.choice(["m", "b"]))

    def stats() -> Callable[[], Any]:
        return lambda: json.dumps(rt.stats())

    # close once a random share of the submits went in (a hang guard, not a timing)
    close_after = rng.randrange(0, 3 * submits)
    drain = rng.random() < 0.5
    base = ledger.submitted

    def wait_submits() -> None:
        end = time.monotonic() + HANG_S
        while ledger.submitted - base < close_after and time.monotonic() < end:
            time.sleep(0.0002)

    closer = [wait_submits, lambda: rt.close(drain=drain)]
    lists = [[sub(i) for i in range(submits)] for _ in range(3)]
    lists += [[rng.choice([set_policy, set_depth, set_share])() for _ in range(8)],
              [set_c() for _ in range(6)],
              [rng.choice([load, unload])() for _ in range(6)], [stats() for _ in range(6)],
              closer]
    threads = [threading.Thread(target=worker, args=(ops,), name=f"conc-{i}", daemon=True)
               for i, ops in enumerate(lists)]
    for th in threads:
        th.start()
    hung = _join(threads)
    closed = threading.Thread(target=rt.close, name="final-close", daemon=True)
    closed.start()
    hung += _join([closed])
    return {"typed": typed, "untyped": untyped, "hung": hung}


def concurrency(rounds: int = 100, device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """``rounds`` of :func:`concurrency_round`; the ledger's counts plus the calls' typed
    error codes, untyped errors and hung threads over all rounds."""
    plans = _plans(device)
    ledger = Ledger()
    typed: Counter[str] = Counter()
    untyped: list[str] = []
    hung: list[str] = []
    for r in range(rounds):
        res = concurrency_round(device, plans, ledger, seed * 100_003 + r)
        typed.update(res["typed"])
        untyped += res["untyped"]
        hung += [f"round {r}: {h}" for h in res["hung"]]
        if hung:
            break
    drained = ledger.wait_idle(HANG_S)
    out = ledger.summary()
    out.update({"device": device, "rounds": rounds, "call_errors": dict(sorted(typed.items())),
                "call_untyped": untyped[:10], "call_untyped_count": len(untyped),
                "hung": hung, "drained": drained})
    return out


# -- shutdown with work in flight ----------------------------------------------------------------
CLOSE_FROM = ("main", "thread", "callback", "listener")


def shutdown_round(device: str, plans: dict, ledger: Ledger, drain: bool, where: str,
                   seed: int, per_thread: int = 8) -> dict[str, Any]:
    """Submit from two threads while ``close(drain)`` runs on ``where`` (the caller's
    thread, another thread, the callback thread, or inside the scheduler via a listener).
    Every future must be answered, with a Result or RuntimeClosedError only; under
    ``drain`` every request accepted before ``close`` was called must get its Result.
    Returns the problems found (empty: none)."""
    from av_infer import Runtime
    from av_infer.model import zoo

    rng = random.Random(seed)
    rt = Runtime(device, c=2)
    ledger.watch(rt)
    rt.load_model("a", plans["a"])
    rt.load_model("b", plans["b"])
    xs = {n: zoo.sample_inputs(m) for n, m in FUZZ_MODELS.items()}
    virtual = bool(getattr(rt.device, "virtual", False))
    futs: list[cf.Future] = []
    before: list[cf.Future] = []  # submit returned before close was called
    lock = threading.Lock()
    closing = threading.Event()
    closed = threading.Event()
    errors: list[str] = []
    fired = threading.Lock()

    def close_once(*_a: Any) -> None:
        if not fired.acquire(blocking=False):
            return
        closing.set()
        try:
            rt.close(drain=drain)
        except Exception as e:  # noqa: BLE001 - close must not raise
            errors.append(f"close raised {type(e).__name__}: {e}")
        closed.set()

    if where == "listener":
        rt.add_listener(lambda ev, _p: close_once() if ev in ("dispatch", "complete") else None)

    def submitter(k: int) -> None:
        for i in range(per_thread):
            m = rng.choice("ab")
            f = ledger.submit(rt, m, xs[m], priority="RT" if (i + k) % 3 == 0 else "BE",
                              client=f"s{k}")
            if f is None:
                continue
            pre = not closing.is_set()
            with lock:
                futs.append(f)
                if pre:
                    before.append(f)
            if where == "callback" and i == 0 and k == 0:
                f.add_done_callback(close_once)

    if virtual:  # one thread: the simulator's loop is single-threaded
        submitter(0)
        submitter(1)
        if where == "main":
            close_once()
        else:
            rt.device.run()
    else:
        subs = [threading.Thread(target=submitter, args=(k,), daemon=True) for k in range(2)]
        for th in subs:
            th.start()
        if where == "main":
            close_once()
        elif where == "thread":
            threading.Thread(target=close_once, daemon=True).start()
        errors += [f"hung: {h}" for h in _join(subs)]
    if not closed.wait(HANG_S) and fired.locked():
        errors.append("hung: close did not return")
    rt.close()  # idempotent: returns once everything is answered
    _, pending = cf.wait(futs, timeout=HANG_S)
    if pending:
        errors.append(f"{len(pending)} futures unanswered after close")
    bad = [f.exception() for f in futs if f.done() and f.exception() is not None
           and not isinstance(f.exception(), RuntimeClosedError)]
    errors += [f"answer {type(e).__name__}: {e}" for e in bad[:3]]
    if drain:
        lost = [f.exception() for f in before if f.done() and f.exception() is not None]
        if lost:
            errors.append(f"drain: {len(lost)} of {len(before)} requests accepted before "
                          f"close failed, e.g. {type(lost[0]).__name__}: {lost[0]}")
    return {"errors": errors, "requests": len(futs), "before_close": len(before)}


def shutdown(rounds: int = 100, device: str = "cpu", seed: int = 0) -> dict[str, Any]:
    """``rounds`` rounds for each of drain/no-drain, closing from every place in
    CLOSE_FROM in turn (sim: the caller's thread and a listener)."""
    plans = _plans(device)
    ledger = Ledger()
    wheres = CLOSE_FROM if device != "sim" else ("main", "listener")
    errors: list[str] = []
    for r in range(rounds):
        for drain in (True, False):
            where = wheres[r % len(wheres)]
            res = shutdown_round(device, plans, ledger, drain, where, seed * 100_003 + r)
            errors += [f"round {r} drain={drain} from {where}: {e}" for e in res["errors"]]
    drained = ledger.wait_idle(HANG_S)
    out = ledger.summary()
    out.update({"device": device, "rounds": rounds, "problems": errors[:10],
                "problem_count": len(errors), "drained": drained})
    return out


# -- the CLI (make soak) ----------------------------------------------------------------------
def _bar(label: str) -> Callable[[float, dict], None]:
    def show(frac: float, s: dict) -> None:
        n = int(frac * 30)
        sys.stderr.write(f"\r{label:<12} [{'#' * n}{'.' * (30 - n)}] {frac * 100:3.0f}% "
                         f"requests={s['requests']} open={s['lost']} "
                         f"dup={s['duplicated']}   ")
        sys.stderr.flush()
    return show


def _fmt_errors(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) or "-"


def table(results: dict[str, dict]) -> str:
    """The soak table: requests, lost, duplicated, typed errors by code, RSS start/end."""
    rows = [("run", "requests", "ok", "lost", "dup", "bugs", "typed errors by code",
             "RSS start/end MB", "verdict")]
    for name, r in results.items():
        rss = (f"{r['rss_start_mb']}/{r['rss_end_mb']} ({r['rss_growth'] * 100:+.1f}%)"
               if r.get("rss_growth") is not None else "-")
        rows.append((name, str(r["requests"]), str(r["ok"]), str(r["lost"]),
                     str(r["duplicated"]), str(r["untyped"] + r.get("submit_raised", 0)),
                     _fmt_errors(r["errors"]), rss, "PASS" if r["pass"] else "FAIL"))
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w[i]) for i, c in enumerate(row)).rstrip() for row in rows]
    for name, r in results.items():  # why a run failed: its first problems
        notes = ([r["error"]] if "error" in r else []) + r.get("samples", [])[:3] + \
            list(r.get("problems", []))[:3] + list(r.get("hung", []))[:3] + \
            list(r.get("call_untyped", []))[:3]
        lines += [f"  {name}: {n[:300]}" for n in dict.fromkeys(notes)]
    return "\n".join(lines)


def _verdict(r: dict, rss_limit: float | None = None) -> bool:
    ok = (r["lost"] == 0 and r["duplicated"] == 0 and r["untyped"] == 0
          and r.get("submit_raised", 0) == 0 and not r.get("hung")
          and not r.get("problem_count") and not r.get("call_untyped_count")
          and "error" not in r)
    if rss_limit is not None and r.get("rss_growth") is not None:
        ok = ok and r["rss_growth"] < rss_limit
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m av_infer.bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0,
                   help="soak duration per device (wall minutes; default 10)")
    p.add_argument("--devices", default="cpu,sim", help="soak devices (default cpu,sim)")
    p.add_argument("--rate-scale", type=float, default=None,
                   help="DISB-E rate factor (default: cpu 0.5, sim 1)")
    p.add_argument("--fuzz", type=int, default=10_000, help="fuzz requests (0: skip)")
    p.add_argument("--concurrency", type=int, default=100, help="concurrency rounds (0: skip)")
    p.add_argument("--shutdown", type=int, default=100,
                   help="shutdown rounds per drain mode (0: skip)")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed (fuzz: the same requests per seed; -1: a random fuzz run)")
    p.add_argument("--rss-limit", type=float, default=0.05,
                   help="largest RSS growth after warm-up that passes (default 0.05)")
    p.add_argument("--json", default="out/soak.json", help="JSON path, or - for stdout")
    a = p.parse_args(argv)
    results: dict[str, dict] = {}
    t0 = time.monotonic()

    def run(name: str, fn: Callable[[], dict], rss: bool = False) -> None:
        sys.stderr.write(f"{name} ...\n")
        try:
            r = fn()
        except (Exception, AssertionError) as e:  # noqa: BLE001 - reported as a failure
            r = {"requests": 0, "ok": 0, "lost": 0, "duplicated": 0, "untyped": 0,
                 "errors": {}, "error": f"{type(e).__name__}: {e}"[:2000]}
        r["pass"] = _verdict(r, a.rss_limit if rss else None)
        results[name] = r
        sys.stderr.write("\n")

    for dev in [d.strip() for d in a.devices.split(",") if d.strip()]:
        run(f"soak {dev}", lambda dev=dev: soak(dev, a.minutes * 60.0, a.rate_scale, a.seed,
                                                progress=_bar(f"soak {dev}")), rss=True)
    if a.fuzz:
        seed = None if a.seed < 0 else a.seed
        run("fuzz sim", lambda: fuzz(a.fuzz, "sim", seed, strict=False))
        run("fuzz cpu", lambda: fuzz(max(1, a.fuzz // 10), "cpu", seed, strict=False))
    if a.concurrency:
        run("concurrency", lambda: concurrency(a.concurrency, "cpu", a.seed))
    if a.shutdown:
        run("shutdown cpu", lambda: shutdown(a.shutdown, "cpu", a.seed))
        run("shutdown sim", lambda: shutdown(a.shutdown, "sim", a.seed))
    doc = {"command": "python -m av_infer.bench.soak " + " ".join(argv or sys.argv[1:]),
           "minutes": a.minutes, "seconds_total": round(time.monotonic() - t0, 1),
           "results": results}
    text = json.dumps(doc, indent=2, default=str, allow_nan=False) if all(
        _finite(r) for r in results.values()) else json.dumps(doc, indent=2, default=str)
    print(table(results), file=sys.stderr if a.json == "-" else sys.stdout)
    if a.json == "-":
        print(text)
    else:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(text + "\n")
        print(f"wrote {a.json}")
    return 0 if all(r["pass"] for r in results.values()) else 1


def _finite(r: dict) -> bool:
    return all(not (isinstance(v, float) and not math.isfinite(v)) for v in r.values())


if __name__ == "__main__":
    raise SystemExit(main())
