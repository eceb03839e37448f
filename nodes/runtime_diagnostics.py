"""The runtime host's monitoring: per-client health (``ClientHealth``: consecutive
deadline misses, expected rates, staleness; levels from ``health``), per-model latency
(``ModelLatency``), both fed by the Runtime's ``complete`` events, and the /diagnostics
statuses built from ``Runtime.stats()`` (``diagnostic_statuses``). No node here: the node
owns the publisher and the timer and calls these (``RuntimeNode.publish_diagnostics``).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from typing import Any

import numpy as np
from av_infer_nodes.health import (
    KV,
    OK,
    WARN,
    ConsecutiveCheck,
    Finding,
    RateCheck,
    Status,
    combine,
)
from av_infer_nodes.runtime_params import parse_client_rates

from av_infer import InvalidParameterError
from av_infer.latency import quantiles

#: Clients ``ClientHealth`` tracks one by one (as the runtime's statistics do).
MAX_HEALTH_CLIENTS = 256



class ClientHealth:
    """Per client, from the runtime's ``complete`` events (every client: in-process and
    remote): consecutive deadline misses (WARN from ``deadline_miss_warn``, ERROR from
    ``deadline_miss_error``); and for the clients ``client_rates`` names, the rate of their
    answers against the expected Hz ± ``rate_tolerance`` and STALE once none came for
    ``stale_timeout_s``. Times are monotonic seconds, passed in (``now``), so tests drive
    the levels. Thread-safe: events come on the runtime's thread."""

    def __init__(self, p: dict[str, Any], start: float):
        if p["deadline_miss_warn"] > p["deadline_miss_error"]:
            raise InvalidParameterError(
                f"deadline_miss_warn ({p['deadline_miss_warn']}) must not be above "
                f"deadline_miss_error ({p['deadline_miss_error']})")
        rates = parse_client_rates(list(p["client_rates"] or []))
        self._warn, self._error = int(p["deadline_miss_warn"]), int(p["deadline_miss_error"])
        self._lock = threading.Lock()
        self.rates = {c: RateCheck(hz, float(p["rate_tolerance"]), float(p["stale_timeout_s"]),
                                   window_s=max(2.0, 5.0 / hz) if hz else 2.0, start=start)
                      for c, hz in rates.items()}
        self.misses: dict[str, ConsecutiveCheck] = {}

    def tick(self, client: str, deadline_met: bool | None, now: float) -> None:
        with self._lock:
            rate = self.rates.get(client)
            if rate is not None:
                rate.tick(now)
            if deadline_met is not None:
                if client not in self.misses and len(self.misses) >= MAX_HEALTH_CLIENTS:
                    client = "(other clients)"  # invented names cannot grow the table
                check = self.misses.get(client)
                if check is None:
                    check = self.misses[client] = ConsecutiveCheck(self._warn, self._error)
                check.tick(not deadline_met)

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        """A Runtime listener."""
        if kind == "complete":
            met = payload.get("deadline_met")
            self.tick(str(payload.get("client")), None if met is None else bool(met),
                      time.monotonic())

    def findings(self, now: float) -> dict[str, Finding]:
        """Client -> its combined finding (expected clients that never answered too)."""
        with self._lock:
            out: dict[str, Finding] = {}
            for c in sorted(set(self.rates) | set(self.misses)):
                parts = []
                if c in self.rates:
                    parts.append(self.rates[c].check(now))
                if c in self.misses:
                    parts.append(self.misses[c].check())
                out[c] = combine(parts)
            return out


class ModelLatency:
    """Per-model latency samples and deadline misses, fed by a Runtime listener."""

    def __init__(self, cap: int = 4096):
        self._lock = threading.Lock()
        self._cap = cap
        self._lat: dict[str, deque[float]] = {}
        self._misses: dict[str, int] = {}
        self._preempted: dict[str, int] = {}

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        if kind != "complete":
            return
        model = str(payload.get("model"))
        with self._lock:
            self._lat.setdefault(model, deque(maxlen=self._cap)).append(
                float(payload.get("latency", math.nan)))
            if payload.get("deadline_met") is False:
                self._misses[model] = self._misses.get(model, 0) + 1
            self._preempted[model] = (self._preempted.get(model, 0)
                                      + int(payload.get("preempted", 0) or 0))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            items = {k: list(v) for k, v in self._lat.items()}
            misses, pre = dict(self._misses), dict(self._preempted)
        out: dict[str, dict[str, Any]] = {}
        for model, samples in items.items():
            a = np.asarray(samples, dtype=np.float64) * 1e3
            p50, p99 = quantiles(a, (0.5, 0.99)) if a.size else (math.nan, math.nan)
            out[model] = {"latency_ms": {"p50": p50, "p99": p99},
                          "deadline_misses": misses.get(model, 0),
                          "preemptions": pre.get(model, 0)}
        return out


def _value_text(value: Any) -> str:
    """A statistic as a ``KeyValue``'s value: floats to 3 decimals, lists and dicts as
    compact JSON, the rest ``str``; a plain ``str`` as it is."""
    if type(value) is str:
        return value
    if isinstance(value, float):
        return f"{value:.3f}" if math.isfinite(value) else str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def _kv(key: str, value: Any) -> KV:
    return KV(key, _value_text(value))


def _flatten(prefix: str, value: Any, out: list[KV]) -> None:
    """``value`` as key/values under ``prefix``, nested dicts joined with "." (a host's
    statistics are ~550-1300 of them, once a second: one loop per dict, no call per
    key but the value's text)."""
    if not isinstance(value, dict):
        out.append(_kv(prefix, value))
        return
    dot = f"{prefix}." if prefix else ""
    for k, v in value.items():
        key = dot + (k if type(k) is str else str(k))
        if isinstance(v, dict):
            _flatten(key, v, out)
        else:
            out.append(KV(key, _value_text(v)))


def diagnostic_statuses(stats: dict[str, Any], device: str, rt: Any,
                        last_misses: dict[str, int], device_reason: str = "",
                        device_fallback: bool = False,
                        client_findings: dict[str, Finding] | None = None,
                        gc_frozen: int = 0) -> list[Status]:
    """Runtime.stats() -> one status for the runtime, one per client, one per model, one
    per variant group.

    The runtime's status names the device and why it was chosen (``device_reason``) and the
    batch mode; it is WARN while ``device_fallback`` (device=auto found no usable GPU and
    runs on cpu) or while the cpu device runs ONNX Runtime through its Python binding
    because its C API could not load (``stats["device"]["ort_api_reason"]``). A client's
    status is WARN when it missed deadlines since the previous publication, and at least
    the level of its ``client_findings`` entry (``ClientHealth``: consecutive misses up to
    ERROR, rate WARN, STALE); an expected client with no statistics yet is reported too
    (STALE until its first answer). A variant group's says which share of its answers each
    variant served and their mean utility κ·V (paper 001; ``stats()["variant_groups"]``).
    ``gc_frozen``: the objects the host froze at activation (``gc_frozen_objects``; the
    count recorded then: ``gc.get_freeze_count()`` walks every frozen object, ~6 ms with
    the GIL held for the ~58 k of the demo's process, once a second on the executor, and
    every data-path callback waited for it, docs/ros.md).
    """
    statuses: list[Status] = []
    policy = getattr(rt, "policy", "?")
    batch_mode = (stats.get("batching") or {}).get("mode", "?")
    head: list[KV] = [_kv("device", device), _kv("device_reason", device_reason),
                            _kv("device_fallback", device_fallback), _kv("policy", policy),
                            _kv("c", getattr(rt, "c", "?")), _kv("batch_mode", batch_mode),
                            _kv("gc_frozen_objects", gc_frozen)]
    for key, value in stats.items():
        if key not in ("clients", "models", "variant_groups"):
            _flatten(key, value, head)
    text = f"{device}, policy {policy}, batch mode {batch_mode}"
    if device_fallback:
        text += f"; {device_reason}"
    # the cpu device asked for ORT's C API ("auto") and runs through the Python binding:
    # it works, but is not what was configured (docs/cpu_engine.md, "The C API path")
    ort_fallback = (stats.get("device") or {}).get("ort_api_reason")
    if ort_fallback:
        text += f"; ONNX Runtime through its Python binding: {ort_fallback}"
    level = WARN if device_fallback or ort_fallback else OK
    statuses.append(Status(bytes([level]), "av_infer: runtime", text, device, head))
    findings = dict(client_findings or {})
    clients = dict(stats.get("clients") or {})
    for name in findings:
        clients.setdefault(name, {})
    for name, cs in sorted(clients.items()):
        values: list[KV] = []
        _flatten("", cs, values)
        finding = findings.get(name, Finding())
        for k, v in finding.values.items():
            values.append(_kv(f"health.{k}", v))
        misses = int(cs.get("deadline_misses", 0) or 0)
        new = misses - last_misses.get(name, 0)
        last_misses[name] = misses
        lat = cs.get("latency_ms") or {}
        p50, p99 = lat.get("p50"), lat.get("p99")
        text = (f"p50 {p50:.2f} ms, p99 {p99:.2f} ms" if p50 is not None and p99 is not None
                else "no completed requests")
        level = WARN if new > 0 else OK
        if new > 0:
            text += f", {new} deadline misses"
        if finding.level != OK:
            text += f"; {finding.message}"
        statuses.append(Status(bytes([max(level, finding.level)]), f"av_infer: client {name}",
                               text, device, values))
    for name, ms in sorted((stats.get("models") or {}).items()):
        values = []
        _flatten("", ms, values)
        statuses.append(Status(bytes([OK]), f"av_infer: model {name}", "loaded", device,
                               values))
    for name, gs in sorted((stats.get("variant_groups") or {}).items()):
        values = []
        _flatten("", gs, values)
        shares = gs.get("share") or {}
        mean = gs.get("mean_utility")
        text = ", ".join(f"{m} {100 * v:.1f} %" for m, v in shares.items() if v is not None)
        text = (f"{text or 'none served'}; mean utility {mean:.3f}" if mean is not None
                else "no completed requests")
        statuses.append(Status(bytes([OK]), f"av_infer: variant group {name}", text, device,
                               values))
    return statuses
