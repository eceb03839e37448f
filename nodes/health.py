"""Health checks behind the nodes' ``/diagnostics``: rate, timestamp age, consecutive
deadline misses and staleness, with the levels ``diagnostic_msgs/DiagnosticStatus`` uses
(OK 0, WARN 1, ERROR 2, STALE 3).

What a safety review asks of a perception input, after the ROS conventions it knows:

* ``RateCheck``: diagnostic_updater's ``FrequencyStatus``: the rate of events over a
  sliding window against an expected rate ± a tolerance (WARN "too low"/"too high"); and
  STALE, not ERROR, once nothing arrived for ``stale_after_s``: the input stopped, and its
  last value must not be trusted (diagnostic_aggregator's meaning of STALE).
* ``StampCheck``: diagnostic_updater's ``TimeStampStatus``: the age ``now - header.stamp``
  of what arrived since the last report; ERROR for a stamp too far in the past (older than
  ``max_age_s``) or in the future (more than ``max_future_s`` ahead) or a zero stamp, as
  TimeStampStatus does. Counts reset at each report, so one old frame reports once.
* ``ConsecutiveCheck``: Autoware's escalation: one deadline miss is a WARN, ``error_after``
  consecutive misses an ERROR; a met deadline resets the run.

The statuses themselves are plain tuples with the message's field names (``Status``,
``KV``), published as the serialised ``DiagnosticArray`` (``diagnostics_cdr``): built as
``diagnostic_msgs`` objects and converted by rclpy, the host's ~230-1300 values cost
1-3 ms a second with the GIL held, which the data path waited for (docs/ros.md).

Every check takes the time as an argument (seconds, one clock per check: ROS time for
stamps, monotonic for arrivals), never reads a clock itself: the nodes pass their clocks,
tests pass chosen times, so the levels are driven deterministically. No ROS import: this
module is usable and tested without a ROS context. Not thread-safe by itself: the nodes
call it under their own lock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from av_infer.tensor_codec import ros_text, write_diagnostics

OK, WARN, ERROR, STALE = 0, 1, 2, 3
LEVEL_NAMES = {OK: "OK", WARN: "WARN", ERROR: "ERROR", STALE: "STALE"}


class KV(NamedTuple):
    """A ``diagnostic_msgs/KeyValue``'s fields."""

    key: str
    value: str


class Status(NamedTuple):
    """A ``diagnostic_msgs/DiagnosticStatus``'s fields; ``level`` one byte, as the message
    holds it (``bytes([WARN])``)."""

    level: bytes
    name: str
    message: str
    hardware_id: str
    values: list[KV]


def diagnostics_cdr(statuses: list[Status], stamp: tuple[int, int], frame_id: str = ""
                    ) -> bytes:
    """``statuses`` as the serialised ``DiagnosticArray`` with the header ``stamp`` (sec,
    nanosec) and ``frame_id``: what ``Publisher.publish`` sends as it is
    (``ros_cdr.write_diagnostics``). A text a ROS string cannot carry (a NUL, a lone
    surrogate) is written with backslash escapes (``\\x00``, ``\\udc80``) instead of
    making the publication fail."""
    try:
        return write_diagnostics(int(stamp[0]), int(stamp[1]), frame_id.encode(), statuses)
    except (ValueError, UnicodeEncodeError):  # rare: escape every text and write again
        safe = [Status(st.level, _text(st.name), _text(st.message), _text(st.hardware_id),
                       [KV(_text(k), _text(v)) for k, v in st.values]) for st in statuses]
        return write_diagnostics(int(stamp[0]), int(stamp[1]), _text(frame_id).encode(),
                                 safe)


def _text(text: str) -> str:
    """``text`` as a ROS string can carry it: ``ros_text`` (lone surrogates escaped) and a
    NUL written as ``\\x00`` (a ROS string would end at it)."""
    return ros_text(text).replace("\x00", "\\x00")


@dataclass
class Finding:
    """One check's verdict: a level, a short message and key/values for the status."""

    level: int = OK
    message: str = "ok"
    values: dict[str, object] = field(default_factory=dict)


def combine(findings: list[Finding]) -> Finding:
    """The worst level (STALE above ERROR, as DiagnosticStatus numbers them); the
    messages of every finding above OK, joined; all values."""
    level = max((f.level for f in findings), default=OK)
    bad = [f.message for f in findings if f.level > OK]
    values: dict[str, object] = {}
    for f in findings:
        values.update(f.values)
    return Finding(level, "; ".join(bad) if bad else "ok", values)


class RateCheck:
    """Events per second over the last ``window_s`` against ``expected_hz`` ± ``tolerance``
    (a fraction); ``expected_hz`` 0 checks only staleness. STALE once no event came for
    ``stale_after_s`` (also before the first one, counted from ``start``)."""

    def __init__(self, expected_hz: float, tolerance: float, stale_after_s: float,
                 window_s: float = 2.0, start: float = 0.0):
        if not (expected_hz >= 0.0 and math.isfinite(expected_hz)):
            raise ValueError(f"expected_hz must be >= 0, got {expected_hz!r}")
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
        if not stale_after_s > 0.0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s!r}")
        if not window_s > 0.0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.expected_hz, self.tolerance = float(expected_hz), float(tolerance)
        self.stale_after_s, self.window_s = float(stale_after_s), float(window_s)
        self._start = float(start)
        self._events: deque[float] = deque()
        self.count = 0
        self.last: float | None = None

    def tick(self, now: float) -> None:
        self._events.append(now)
        self.count += 1
        self.last = now
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0] < now - self.window_s:
            self._events.popleft()

    def rate(self, now: float) -> float:
        """Events per second in the window ending ``now`` (over the part of the window
        since ``start`` while that is shorter)."""
        self._trim(now)
        span = min(self.window_s, now - self._start)
        return len(self._events) / span if span > 0 else math.nan

    def check(self, now: float) -> Finding:
        rate = self.rate(now)
        since = now - (self.last if self.last is not None else self._start)
        values: dict[str, object] = {"rate_hz": rate, "expected_hz": self.expected_hz,
                                     "events": self.count, "since_last_s": since}
        if since > self.stale_after_s:
            what = "no input yet" if not self.count else "input stopped"
            return Finding(STALE, f"{what}: nothing for {since:.2f} s "
                                  f"(stale after {self.stale_after_s:g} s)", values)
        if self.expected_hz > 0 and now - self._start >= self.window_s:
            lo = self.expected_hz * (1.0 - self.tolerance)
            hi = self.expected_hz * (1.0 + self.tolerance)
            if rate < lo:
                return Finding(WARN, f"rate too low: {rate:.1f} Hz, expected "
                                     f"{self.expected_hz:g} Hz ± {100 * self.tolerance:g} %",
                               values)
            if rate > hi:
                return Finding(WARN, f"rate too high: {rate:.1f} Hz, expected "
                                     f"{self.expected_hz:g} Hz ± {100 * self.tolerance:g} %",
                               values)
        return Finding(OK, "ok", values)


class StampCheck:
    """``now - stamp`` of what arrived since the last ``check`` (TimeStampStatus): ERROR
    beyond ``max_age_s`` in the past or ``max_future_s`` in the future, or a zero stamp;
    ``max_age_s`` 0 turns the age bound off (zero and future stamps are still checked)."""

    def __init__(self, max_age_s: float, max_future_s: float):
        if not (max_age_s >= 0.0 and max_future_s >= 0.0):
            raise ValueError("max_age_s and max_future_s must be >= 0")
        self.max_age_s, self.max_future_s = float(max_age_s), float(max_future_s)
        self._reset()
        self.last_age_s = math.nan

    def _reset(self) -> None:
        self._old = self._future = self._zero = 0
        self._max_age = -math.inf
        self._min_age = math.inf

    def tick(self, stamp_s: float, now: float) -> None:
        """``stamp_s``: the message's header stamp in seconds (0: unset)."""
        if stamp_s == 0.0:
            self._zero += 1
            return
        age = now - stamp_s
        self.last_age_s = age
        self._max_age = max(self._max_age, age)
        self._min_age = min(self._min_age, age)
        if self.max_age_s > 0 and age > self.max_age_s:
            self._old += 1
        if age < -self.max_future_s:
            self._future += 1

    def check(self) -> Finding:
        values: dict[str, object] = {
            "stamp_age_max_s": self._max_age if math.isfinite(self._max_age) else math.nan,
            "stamp_age_min_s": self._min_age if math.isfinite(self._min_age) else math.nan,
            "stamps_too_old": self._old, "stamps_in_future": self._future,
            "stamps_zero": self._zero}
        bad = []
        if self._old:
            bad.append(f"{self._old} stamps older than {self.max_age_s * 1e3:g} ms "
                       f"(oldest {self._max_age * 1e3:.1f} ms)")
        if self._future:
            bad.append(f"{self._future} stamps more than {self.max_future_s * 1e3:g} ms in "
                       "the future")
        if self._zero:
            bad.append(f"{self._zero} zero stamps")
        self._reset()
        return Finding(ERROR if bad else OK, "; ".join(bad) or "ok", values)


class ConsecutiveCheck:
    """Consecutive deadline misses (Autoware's escalation): WARN from ``warn_after``
    (1: the first miss), ERROR from ``error_after``; a met deadline ends the run. The
    level stays until then: an input that keeps missing stays ERROR however often it is
    reported."""

    def __init__(self, warn_after: int, error_after: int, what: str = "deadline misses"):
        if not 1 <= warn_after <= error_after:
            raise ValueError(f"need 1 <= warn_after <= error_after, got {warn_after}, "
                             f"{error_after}")
        self.warn_after, self.error_after, self.what = int(warn_after), int(error_after), what
        self.run = 0
        self.longest = 0
        self.total = 0

    def tick(self, missed: bool) -> None:
        if missed:
            self.run += 1
            self.total += 1
            self.longest = max(self.longest, self.run)
        else:
            self.run = 0

    def check(self) -> Finding:
        values: dict[str, object] = {"consecutive_misses": self.run, "misses": self.total,
                                     "longest_miss_run": self.longest}
        if self.run >= self.error_after:
            return Finding(ERROR, f"{self.run} consecutive {self.what} (ERROR from "
                                  f"{self.error_after})", values)
        if self.run >= self.warn_after:
            return Finding(WARN, f"{self.run} consecutive {self.what}", values)
        return Finding(OK, "ok", values)


def status_of(finding: Finding, name: str, hardware_id: str = "",
              extra: dict[str, object] | None = None) -> Status:
    """``finding`` as a ``Status`` (floats to 6 significant digits)."""

    def text(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    values = {**finding.values, **(extra or {})}
    return Status(bytes([finding.level]), name, finding.message, hardware_id,
                  [KV(str(k), text(v)) for k, v in values.items()])
