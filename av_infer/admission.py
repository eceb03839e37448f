# cython: annotation_typing=False, nonecheck=True, language_level=3
"""Admission: one request, from the caller's arguments to the driver.

Why a module of its own, compiled: every ``Runtime.submit``/``infer`` runs this, and it
was the last stretch of the request path the interpreter ran as Python frames (the
runtime's request builder, the registry look-up, the input checks: docs/request_path.md,
"The front, compiled"). Compiled with ``admission.pxd`` (Cython's pure-Python mode,
av_infer/_cy/compiled.py), :class:`Admission` is a ``cdef class`` whose ``submit`` is a C
method: the options are read as struct members of the compiled ``RequestOptions``, the
inputs checked by the compiled ``validate_inputs``, the ``Request`` built with its C
constructor and posted with the driver's C ``post``. The ``.py`` is the one source and
runs interpreted where it is not built (``AV_INFER_INTERPRETED=1``).

What it guarantees (unchanged from the runtime's request builder it replaces): every
argument is validated before anything is queued; the first thing wrong becomes the
request's typed error (an already-failed future, counted in ``submit_errors``), never an
exception out of ``submit``; a request is built once, with a process-unique id, and
posted once. One owner: the ``closed`` flag new submits are refused by lives here
(``Runtime.close`` sets it, ``Runtime._closed`` reads it), as does the request id counter.
"""

from __future__ import annotations

import itertools
import math
import threading
from typing import Any

import numpy as np

from av_infer.errors import (
    AvInferError,
    InvalidParameterError,
    RuntimeClosedError,
    UnknownModelError,
)
from av_infer.inputs import validate_inputs
from av_infer.request_options import (
    ARRIVAL_AHEAD_S,
    ARRIVAL_MAX_AGE_S,
    RequestOptions,
    check_client,
    parse_priority,
    seconds,
)
from av_infer.sched.driver import RequestFuture
from av_infer.sched.request import Request, Timings

__all__ = ["Admission"]

_get_ident = threading.get_ident
_inf = math.inf
_nan = math.nan


class Admission:
    """Validates, builds and posts requests for one runtime.

    ``reg``: the runtime's ``ModelRegistry`` (models, groups, clients: one look per
    request); ``device``: its clock (``now``); ``driver``: where arrivals go;
    ``on_utility(client, future)`` / ``on_quality(group, future)``: the runtime's
    done-callbacks for clients with tracked deadline utility and for variant groups."""

    def __init__(self, reg: Any, device: Any, driver: Any, on_utility: Any,
                 on_quality: Any) -> None:
        self.reg = reg
        self.driver = driver
        self._now = device.now  # the one thing of the device admission reads
        self._on_utility = on_utility
        self._on_quality = on_quality
        #: new submits are refused (RuntimeClosedError) once set (``Runtime.close``)
        self.closed = False
        self._ids = itertools.count(1)

    def submit(self, model: Any, inputs: Any, opts: RequestOptions,
               caller_runs: bool) -> RequestFuture:
        """One request: validated (the typed error of the first thing wrong fails the
        future, nothing is queued), built once, posted to the driver. ``caller_runs``:
        this thread runs the launches next (``infer``, ``submit(run_here=True)``), so an
        enqueue made while it handles its own arrival skips the worker's wake-up."""
        fut = RequestFuture(self.driver)
        try:
            req, entry, cfg = self._build(model, inputs, opts)
        except AvInferError as e:
            self.reg.count_submit_error(e.code)
            fut.set_exception(e)
            return fut
        req.future = fut
        if cfg.utility:  # the tracker follows configure_client, as this flag does
            fut.add_done_callback(_Callback(self._on_utility, req.client))
        if entry.variants is not None:
            fut.add_done_callback(_Callback(self._on_quality, req.model))
        fut.request = req  # a waiting thread runs its launches (RequestFuture._help)
        # an enqueue made on this thread while it handles its own arrival skips the
        # worker's wake-up, since this thread runs the launches right after (a start on
        # any other thread, or later, wakes a worker: nothing is left unrun)
        req.caller_runs = _get_ident() if caller_runs else 0
        self.driver.post(("arrival", req, entry))
        req.caller_runs = 0
        return fut

    def _build(self, model: Any, inputs: Any, opts: RequestOptions) -> tuple:
        """(request, entry, client configuration), or the typed error of the first thing
        wrong. One look at the registry, under one acquisition of its lock."""
        if self.closed:
            raise RuntimeClosedError("runtime is closed")
        client = check_client(opts.client)
        reg = self.reg
        cfg, gname, grp, entry = reg.resolve(model, client, opts.variant_group)
        if gname is not None:
            if grp is None:
                raise UnknownModelError(f"unknown variant group {gname!r}; defined: "
                                        f"{reg.variant_groups()}")
            if model != gname and model not in grp[0].models:
                raise InvalidParameterError(
                    f"model {model!r} is not in variant group {gname!r} {grp[0].models}")
            model = gname
        if entry is None:
            raise UnknownModelError(f"unknown model {model!r}; loaded: {reg.names()}")
        priority = opts.priority
        prio = cfg.priority if priority is None else parse_priority(priority)
        copied = validate_inputs(model, entry.input_spec, inputs, opts.borrow)
        received = self._now()
        if opts.arrival is None:
            arrival = received
        else:
            arrival = seconds("arrival", opts.arrival)
            if not received - ARRIVAL_MAX_AGE_S <= arrival <= received + ARRIVAL_AHEAD_S:
                raise InvalidParameterError(
                    f"arrival must be on now()'s clock, within {ARRIVAL_MAX_AGE_S:g} s before "
                    f"now() ({received:.6f}) and not after it (+{ARRIVAL_AHEAD_S * 1e3:g} ms); "
                    f"got {opts.arrival!r}")
        if opts.deadline is None:
            rel = cfg.relative_deadline
            deadline = arrival + rel if rel else _inf
        else:
            deadline = seconds("deadline", opts.deadline, True)
        if opts.hard_deadline is None:
            rel = cfg.hard_deadline
            hard = arrival + rel if rel else _inf
            if hard < deadline:  # a per-request soft deadline may pass the client's hard
                hard = deadline
        else:
            hard = seconds("hard_deadline", opts.hard_deadline, True)
            if deadline == _inf:  # a hard deadline alone: a step utility (soft = hard)
                deadline = hard
            if hard < deadline:
                raise InvalidParameterError(
                    f"hard_deadline {hard} is before the (soft) deadline {deadline}")
        drop_late = opts.drop_late
        if drop_late is None:
            drop_late = cfg.drop_late
        elif not isinstance(drop_late, (bool, np.bool_)):
            raise InvalidParameterError(f"drop_late must be a bool, got {drop_late!r}")
        # positional: the C constructors take no keywords without a dict
        req = Request(next(self._ids), model, copied, prio, client, deadline, bool(drop_late),
                      Timings(arrival, _nan, _nan, _nan, 0, 0, received), None, -1, 0, hard)
        return req, entry, cfg


class _Callback:
    """``fn(key, future)`` as a future's done-callback (a small object instead of a
    closure per request)."""

    __slots__ = ("fn", "key")

    def __init__(self, fn: Any, key: Any) -> None:
        self.fn = fn
        self.key = key

    def __call__(self, fut: Any) -> None:
        self.fn(self.key, fut)
