"""Forecast of the next RT arrivals, and quiet windows that keep BE kernels off the device
across them (issue 13).

Why: a running GPU block cannot be killed, so the BE blocks resident when an RT request
arrives keep running for their full length (hundreds of µs for DISB's BE kernels: the
``preemption_latency_us`` of the benchmark) and share the memory system with the first RT
kernels, slowing them. Where RT arrivals are regular (a camera, a lidar, DISB's periodic
clients) the next one is predictable, and a BE kernel that would still be running then can
simply wait: the time left before the arrival is too short for it anyway.

:class:`RtForecast` learns, per RT client, a period from its last arrivals: the smallest lag
``L`` (1..``max_lag``) whose last ``L``-apart gaps agree within ``tolerance`` (lag 2 finds
two cameras merged into one client). Clients without such a period (Poisson, bursts) get
no forecast, and then nothing is held: the mechanism only acts on what it can predict.
A window starts late by the client's *allowance*, :data:`BUDGET` (1 %, issue 13's RT
budget) of its shortest recent RT latency: a BE kernel ending before then overruns any
arrival inside the window by at most that, and holding it would cost BE more than it can
save RT (measured on DISB D, h100: budget 0 gives 0.898x streams' req/s at RT p99 1.000x,
1 % gives 0.899x at 1.0025x; docs/bench.md "GPU sharing").

:class:`QuietWindows` is a runtime listener that feeds the forecast from ``arrival``
events (and RT latencies from ``complete`` events) and hands the windows
``[predicted - slack + allowance, predicted + slack]`` to the device
(``Device.set_quiet``), for the streams BE tasks run on. The device holds a BE launch
whose kernel would overlap a window until the window ends (or the stream's flag goes up,
when it starts and evicts itself at once). On CUDA this is a host-side hold in the
dispatcher before ``cuLaunchKernel`` (the vHQ has transmitted it; the GPU has not seen
it), with the kernel's profiled duration; no device feature is involved.
"""

from __future__ import annotations

from collections import deque
from typing import Any

#: arrivals (and RT latencies) kept per client
HISTORY = 9
#: share of an RT request's latency a BE kernel may overrun its predicted arrival by
#: (:meth:`RtForecast.allowance`): issue 13's RT budget (p99 within +1 % of rt_only)
BUDGET = 0.01


class RtForecast:
    """Per-client period detection from recent arrival times (seconds)."""

    def __init__(self, max_lag: int = 4, tolerance: float = 0.05, min_slack: float = 50e-6,
                 max_slack: float = 500e-6, budget: float = BUDGET) -> None:
        if (max_lag < 1 or not 0 < tolerance < 1 or not 0 <= min_slack <= max_slack
                or not 0 <= budget < 1):
            raise ValueError("max_lag >= 1, 0 < tolerance < 1, 0 <= min_slack <= max_slack, "
                             "0 <= budget < 1")
        self.max_lag = max_lag
        self.tolerance = tolerance
        self.min_slack = min_slack
        self.max_slack = max_slack
        self.budget = budget
        self._hist: dict[str, deque[float]] = {}
        self._lat: dict[str, deque[float]] = {}

    def observe_latency(self, client: str, latency: float) -> None:
        """One RT request of ``client`` took ``latency`` seconds (arrival to completion)."""
        h = self._lat.get(client)
        if h is None:
            h = self._lat[client] = deque(maxlen=HISTORY)
        h.append(latency)

    def allowance(self, client: str) -> float:
        """How long a BE kernel may still run after ``client``'s earliest predicted
        arrival: ``budget`` x the shortest of its recent RT latencies (0 before one)."""
        h = self._lat.get(client)
        return self.budget * min(h) if h else 0.0

    def observe(self, client: str, t: float) -> None:
        """One arrival of ``client`` at ``t`` (non-decreasing per client)."""
        h = self._hist.get(client)
        if h is None:
            h = self._hist[client] = deque(maxlen=HISTORY)
        h.append(t)

    def next_arrival(self, client: str) -> tuple[float, float] | None:
        """``(predicted time, slack)`` of ``client``'s next arrival, or None when its
        arrivals show no period (the slack covers twice the jitter seen, at least
        ``min_slack``; jitter needing more than ``max_slack`` is no period: a window
        that wide would hold back more BE work than the drain it saves costs RT)."""
        h = self._hist.get(client)
        if h is None:
            return None
        a = list(h)
        for lag in range(1, self.max_lag + 1):
            gaps = [a[i] - a[i - lag] for i in range(lag, len(a))]
            if len(gaps) < 3:
                break
            mean = sum(gaps) / len(gaps)
            if mean <= 0:
                continue
            dev = max(abs(g - mean) for g in gaps)
            if dev <= self.tolerance * mean and 2 * dev <= self.max_slack:
                return a[-lag] + mean, max(self.min_slack, 2 * dev)
        return None

    def windows(self, now: float) -> list[tuple[float, float]]:
        """Predicted ``(start, end)`` windows of every client, sorted, ending after now.

        A window starts at the earliest predicted arrival plus the client's
        :meth:`allowance`: a BE kernel that ends before it overruns any arrival inside
        the window by at most the allowance, so it may start."""
        out = []
        for client in self._hist:
            nxt = self.next_arrival(client)
            if nxt is not None and nxt[0] + nxt[1] > now:
                end = nxt[0] + nxt[1]
                out.append((min(end, nxt[0] - nxt[1] + self.allowance(client)), end))
        out.sort()
        return out


class QuietWindows:
    """Runtime listener: RT arrivals -> forecast -> ``device.set_quiet`` on BE streams.

    Add it with ``runtime.add_listener(QuietWindows(runtime.device))`` under a policy that
    preempts BE work (it holds BE launches; under ``streams`` it would only cost BE)."""

    #: the scheduler calls it for these kinds only (``Scheduler.listeners``): no payload is
    #: built for it per kernel completion
    event_kinds = frozenset(("arrival", "dispatch", "complete"))

    def __init__(self, device: Any, forecast: RtForecast | None = None) -> None:
        self.device = device
        self.forecast = forecast or RtForecast()
        self.be_streams: set[int] = set()
        self.windows: list[tuple[float, float]] = []

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if event == "dispatch":
            if data.get("priority") == "BE" and data["stream"] not in self.be_streams:
                self.be_streams.add(int(data["stream"]))
                self.device.set_quiet(int(data["stream"]), self.windows)
            return
        if event == "complete" and data.get("priority") == "RT":
            lat = data.get("latency")
            if lat is not None and lat == lat:
                self.forecast.observe_latency(str(data.get("client")), float(lat))
            return
        if event != "arrival" or data.get("priority") != "RT":
            return
        t = data.get("t")
        if t is None or t != t:  # no arrival time: nothing to learn from
            return
        now = float(t)
        self.forecast.observe(str(data.get("client")), now)
        # windows not over yet stay (this arrival's own one holds BE until its flag is up)
        keep = {w for w in self.windows if w[1] > now}
        self.windows = sorted(keep.union(self.forecast.windows(now)))
        for s in self.be_streams:
            self.device.set_quiet(s, self.windows)
