"""What one request asks for besides its model and inputs: :class:`RequestOptions`.

Why a value: ``Runtime.submit``/``infer`` take eight per-request options (priority,
deadlines, client, arrival, drop_late, variant group, whether the inputs may be borrowed).
They used to travel as a nine-argument list through ``submit`` -> ``_submit`` ->
``_make_request``, repeated in each signature; now the API builds one immutable
``RequestOptions`` and the request builder reads it. The value is *raw*: it holds what the
caller passed (``None``: the client's configured default) and validates nothing; the
runtime validates it once, when it builds the request, so a bad option becomes the
request's typed error (an already-failed future), never an exception out of ``submit``.

It is built once per request on the hot path, so :meth:`RequestOptions.of` makes one
without the frozen dataclass's per-field ``object.__setattr__`` (same value, same
equality, still frozen).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from av_infer.errors import InvalidParameterError

__all__ = ["ARRIVAL_AHEAD_S", "ARRIVAL_MAX_AGE_S", "RequestOptions", "seconds"]

#: a request's ``arrival`` (``submit``/``infer``) must lie on ``now()``'s clock: at most this
#: long before ``now()`` and no later than ``ARRIVAL_AHEAD_S`` after it. Latency, EDF order
#: and the RT forecast are all measured from it; an arrival from another clock or a bad
#: value (the reliability fuzz sends -1e308) would otherwise give absurd latencies that
#: overflow the latency statistics every client of the model shares.
ARRIVAL_MAX_AGE_S = 3600.0
#: the clock reads of a caller that waits for its scheduled time (``time.sleep``) may land
#: a hair before it
ARRIVAL_AHEAD_S = 1e-3

_new = object.__new__
_set = object.__setattr__


@dataclass(frozen=True)
class RequestOptions:
    """One request's options, as the caller gave them (``None``: the client's default).

    ``priority``: ``Priority`` or its name; ``deadline``/``hard_deadline``: absolute
    seconds on ``Runtime.now()``'s clock; ``client``: whose configuration applies;
    ``arrival``: when the request arrived (default: now); ``drop_late``: fail rather than
    start after the deadline; ``variant_group``: serve the model by this group;
    ``borrow``: the runtime may read the caller's input arrays in place (``infer``
    without a timeout: the caller waits) instead of copying them.
    """

    priority: Any = None
    deadline: Any = None
    client: Any = "default"
    arrival: Any = None
    drop_late: Any = None
    hard_deadline: Any = None
    variant_group: Any = None
    borrow: bool = False

    @classmethod
    def of(cls, priority: Any, deadline: Any, client: Any, arrival: Any, drop_late: Any,
           hard_deadline: Any, variant_group: Any, borrow: bool) -> RequestOptions:
        """The same value as ``RequestOptions(...)`` with every field given, built with one
        attribute write instead of eight (the request path builds one per request)."""
        o = _new(cls)
        _set(o, "__dict__", {"priority": priority, "deadline": deadline, "client": client,
                             "arrival": arrival, "drop_late": drop_late,
                             "hard_deadline": hard_deadline,
                             "variant_group": variant_group, "borrow": borrow})
        return o


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
