# cython: annotation_typing=False, language_level=3
"""What one request asks for besides its model and inputs: :class:`RequestOptions`.

Why a value: ``Runtime.submit``/``infer`` take eight per-request options (priority,
deadlines, client, arrival, drop_late, variant group, whether the inputs may be borrowed).
They used to travel as a nine-argument list through ``submit`` -> ``_submit`` ->
``_make_request``, repeated in each signature; now the API builds one immutable
``RequestOptions`` and the request builder reads it. The value is *raw*: it holds what the
caller passed (``None``: the client's configured default) and validates nothing; the
runtime validates it once, when it builds the request, so a bad option becomes the
request's typed error (an already-failed future), never an exception out of ``submit``.

It is built once per request on the hot path, so it is compiled where built
(``request_options.pxd``, Cython's pure-Python mode, av_infer/_cy/compiled.py): a ``cdef
class`` with C fields, made with one C constructor call and read by the compiled
admission (``admission.py``) as struct members. The ``.py`` is the one source and runs
interpreted where it is not built.
"""

from __future__ import annotations

import math
from dataclasses import FrozenInstanceError
from typing import Any

import cython

from av_infer.errors import InvalidParameterError
from av_infer.sched.request import Priority

__all__ = ["ARRIVAL_AHEAD_S", "ARRIVAL_MAX_AGE_S", "FIELDS", "RequestOptions", "check_client",
           "parse_priority", "seconds"]

#: a request's ``arrival`` (``submit``/``infer``) must lie on ``now()``'s clock: at most this
#: long before ``now()`` and no later than ``ARRIVAL_AHEAD_S`` after it. Latency, EDF order
#: and the RT forecast are all measured from it; an arrival from another clock or a bad
#: value (the reliability fuzz sends -1e308) would otherwise give absurd latencies that
#: overflow the latency statistics every client of the model shares.
ARRIVAL_MAX_AGE_S = 3600.0
#: the clock reads of a caller that waits for its scheduled time (``time.sleep``) may land
#: a hair before it
ARRIVAL_AHEAD_S = 1e-3

_set = object.__setattr__
_parse = Priority.parse

#: the options, in constructor order
FIELDS = ("priority", "deadline", "client", "arrival", "drop_late", "hard_deadline",
          "variant_group", "borrow")


class RequestOptions:
    """One request's options, as the caller gave them (``None``: the client's default).

    ``priority``: ``Priority`` or its name; ``deadline``/``hard_deadline``: absolute
    seconds on ``Runtime.now()``'s clock; ``client``: whose configuration applies;
    ``arrival``: when the request arrived (default: now); ``drop_late``: fail rather than
    start after the deadline; ``variant_group``: serve the model by this group;
    ``borrow``: the runtime may read the caller's input arrays in place (``infer``
    without a timeout: the caller waits) instead of copying them.

    A value: read-only fields (assignment raises ``FrozenInstanceError``), field-wise
    ``==`` and ``hash``, a ``repr`` naming every field, picklable (what the frozen
    dataclass it replaces gave; ``FIELDS`` lists the fields in constructor order).
    """

    def __init__(self, priority: Any = None, deadline: Any = None, client: Any = "default",
                 arrival: Any = None, drop_late: Any = None, hard_deadline: Any = None,
                 variant_group: Any = None, borrow: bool = False) -> None:
        if cython.compiled:  # C fields: written here, read-only from Python
            self.priority = priority
            self.deadline = deadline
            self.client = client
            self.arrival = arrival
            self.drop_late = drop_late
            self.hard_deadline = hard_deadline
            self.variant_group = variant_group
            self.borrow = borrow
        else:  # interpreted: one __dict__ write past the refusing __setattr__
            _set(self, "__dict__", {"priority": priority, "deadline": deadline,
                                    "client": client, "arrival": arrival,
                                    "drop_late": drop_late, "hard_deadline": hard_deadline,
                                    "variant_group": variant_group, "borrow": bool(borrow)})

    @classmethod
    def of(cls, priority: Any, deadline: Any, client: Any, arrival: Any, drop_late: Any,
           hard_deadline: Any, variant_group: Any, borrow: bool) -> RequestOptions:
        """The same value as ``RequestOptions(...)`` with every field given (kept for
        callers of the dataclass era's fast constructor)."""
        return cls(priority, deadline, client, arrival, drop_late, hard_deadline,
                   variant_group, borrow)

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _key(self) -> tuple:
        return (self.priority, self.deadline, self.client, self.arrival, self.drop_late,
                self.hard_deadline, self.variant_group, self.borrow)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestOptions):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, RequestOptions):
            return NotImplemented
        return self._key() != other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "RequestOptions(" + ", ".join(
            f"{n}={v!r}" for n, v in zip(FIELDS, self._key())) + ")"

    def __reduce__(self) -> tuple:
        return (RequestOptions, self._key())


def seconds(what: str, v: Any, allow_inf: bool = False) -> float:
    """``v`` as a finite number of seconds (``allow_inf``: +inf too), else
    InvalidParameterError naming ``what``."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{what} must be a number (seconds), got {v!r}") from None
    if math.isnan(x) or (math.isinf(x) and not (allow_inf and x > 0)):
        raise InvalidParameterError(f"{what} must be a finite number of seconds, got {v!r}")
    return x


def check_client(client: Any) -> Any:
    """``client`` if it is a client name (a non-empty string), else InvalidParameterError.

    The one check of a client name: ``Runtime.configure_client`` and every request
    (``admission``) call it. Compiled, a C function (``request_options.pxd``)."""
    if not isinstance(client, str) or not client:
        raise InvalidParameterError(f"client must be a non-empty string, got {client!r}")
    return client


def parse_priority(priority: Any) -> Priority:
    """``priority`` (a ``Priority``, its name or its value) as a ``Priority``, else
    InvalidParameterError with ``Priority.parse``'s message.

    The one check of a priority: ``Runtime.configure_client`` and every request that
    names one (``admission``) call it. Compiled, a C function (``request_options.pxd``);
    a ``Priority`` is returned without a call."""
    if type(priority) is Priority:
        return priority
    try:
        return _parse(priority)
    except (ValueError, TypeError) as e:
        raise InvalidParameterError(str(e)) from None
