"""Clusters of heterogeneous devices: ``SPEC`` strings like ``h100:25,orin:75`` or ``cpu:2``.

A device *type* says where its block profiles come from and how fast its network link is:

* simulated GPUs (every name in :data:`av_infer.profiles.GPUS`: ``mi50``, ``h100``,
  ``h200``, ``orin``): block latencies derived from the plans' geometry (roofline + occupancy), on
  the models' ``full`` variant; the cluster simulator runs them in virtual time;
* ``cpu``: real lanes; each member is an av_infer ``Runtime`` on the cpu device, block
  latencies measured with ONNX Runtime on the ``scaled`` variant.

* any other name: a *measured* type, defined by its block profiles (a ``--profiles``
  directory, :mod:`.profile_files`) and its links (a cluster file, :func:`load_cluster_file`);
  there is no closed list. Built-in names keep their derived profiles as a fallback, and
  every output names each type's ``source`` (``derived`` or ``measured``).

Links: each server has an uplink and a downlink of ``link_gbps`` and a per-transfer
latency ``link_us``; a server holds ``gpus_per_server`` devices of one type, and every
virtual device on it shares its links (PPipe's network contention). A transfer between
two types runs at the slower link and pays the larger latency. Built-in types: one
device per server and a fixed ``link_us`` of 20 us (200 us for ``cpu`` lanes), stated in
the plan's output; a cluster file states both per type.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from av_infer.errors import InvalidParameterError
from av_infer.pipeline.errors import (
    ProfileFormatError,
    ProfileUnitsError,
    UnknownDeviceTypeError,
)
from av_infer.pipeline.profile_files import read_json
from av_infer.profiles import GPUS

CLUSTER_FORMAT = "av_infer.cluster"
CLUSTER_FORMAT_VERSION = 1
#: link of a measured type named in a SPEC (no cluster file to say better); stated in outputs
DEFAULT_LINK_GBPS = 25.0
DEFAULT_LINK_US = 0.0


@dataclass(frozen=True)
class DeviceType:
    """One kind of device in a cluster; ``rank`` orders types from high to low class."""

    name: str
    simulated: bool
    variant: str  # zoo variant its profiles are taken on
    link_gbps: float
    link_us: float
    rank: float  # peak TFLOP/s for GPUs; the order in which "fastest" is decided
    source: str = "derived"  # where its block latencies come from: derived | measured
    gpus_per_server: int = 1  # devices sharing one server's uplink and downlink
    fractions: tuple[int, ...] | None = None  # 1/v splits the planner may use (None: all)

    def describe(self) -> dict[str, Any]:
        """What every plan and simulation output states about the type."""
        return {"source": self.source, "link_gbps": self.link_gbps,
                "link_latency_us": self.link_us, "gpus_per_server": self.gpus_per_server,
                "fractions": list(self.fractions) if self.fractions else "all profiled"}


#: NIC bandwidth of the simulated GPU types: datacenter GPUs on 100 GbE, the embedded Orin
#: on 10 GbE (a vehicle's automotive Ethernet is in the same range).
_LINK_GBPS = {"h100": 100.0, "h200": 100.0, "mi50": 25.0, "orin": 10.0}


def device_type(name: str) -> DeviceType:
    """The :class:`DeviceType` called ``name`` (case-insensitive); UnknownDeviceTypeError."""
    key = str(name).strip().lower()
    if key in GPUS:
        return DeviceType(key, True, "full", _LINK_GBPS.get(key, 25.0), 20.0,
                          GPUS[key].peak_tflops)
    if key == "cpu":
        # in-process hand-over or ROS 2 loopback: ~GB/s, a fraction of a ms per message
        return DeviceType("cpu", False, "scaled", 8.0, 200.0, 0.1, "measured")
    raise UnknownDeviceTypeError(
        f"unknown device type {name!r}; known: {', '.join(known_types())}")


def known_types() -> list[str]:
    return [*sorted(GPUS), "cpu"]


@dataclass(frozen=True)
class Cluster:
    """Device counts per type, in the order the spec gave them; ``defs``: the types that
    are not built in (or built-in names redefined by a cluster file)."""

    counts: tuple[tuple[str, int], ...]
    defs: tuple[DeviceType, ...] = ()

    @property
    def types(self) -> list[DeviceType]:
        own = {t.name: t for t in self.defs}
        return [own[n] if n in own else device_type(n) for n, _ in self.counts]

    def type(self, name: str) -> DeviceType:
        return next(t for t in self.types if t.name == name)

    def describe(self) -> dict[str, Any]:
        """Per type: its count and :meth:`DeviceType.describe`."""
        return {t.name: {"count": self.count(t.name), **t.describe()} for t in self.types}

    def count(self, name: str) -> int:
        return dict(self.counts).get(name, 0)

    @property
    def total(self) -> int:
        return sum(n for _, n in self.counts)

    @property
    def simulated(self) -> bool:
        return all(t.simulated for t in self.types)

    def spec(self) -> str:
        return ",".join(f"{n}:{c}" for n, c in self.counts)

    def without(self, name: str, n: int = 1) -> Cluster:
        """This cluster less ``n`` devices of type ``name`` (types left empty vanish)."""
        out = [(t, c - n if t == name else c) for t, c in self.counts]
        return Cluster(tuple((t, c) for t, c in out if c > 0), self.defs)


def parse_cluster(spec: str) -> Cluster:
    """``TYPE:COUNT[,TYPE:COUNT...]``; a bare ``TYPE`` means one device. Mixing simulated
    GPUs and real lanes in one cluster is refused (they do not share a clock)."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidParameterError(f"cluster spec must look like 'h100:4,orin:12', got {spec!r}")
    counts: dict[str, int] = {}
    for part in spec.split(","):
        name, _, num = part.strip().partition(":")
        dt = device_type(name)
        n = _spec_count(spec, name, num)
        counts[dt.name] = counts.get(dt.name, 0) + n
    cluster = Cluster(tuple(counts.items()))
    if len({t.simulated for t in cluster.types}) > 1:
        raise InvalidParameterError(
            f"cluster spec {spec!r} mixes simulated GPUs and real lanes; use one kind")
    return cluster


def _measured_type(name: str, by_source: set[str], variant: str = "",
                   link_gbps: float | None = None, link_us: float | None = None,
                   gpus_per_server: int = 1, fractions: tuple[int, ...] | None = None
                   ) -> DeviceType:
    try:
        base = device_type(name)
    except UnknownDeviceTypeError:
        base = DeviceType(name, True, variant, DEFAULT_LINK_GBPS, DEFAULT_LINK_US, 0.0)
    source = "measured" if by_source == {"measured"} else "derived"
    return replace(base, simulated=True, variant=variant or base.variant,
                   link_gbps=base.link_gbps if link_gbps is None else float(link_gbps),
                   link_us=base.link_us if link_us is None else float(link_us),
                   source=source, gpus_per_server=int(gpus_per_server), fractions=fractions)


def _profile_types(profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[set, str]]:
    """Device type -> (sources of its profiles, a variant named in them)."""
    out: dict[str, tuple[set, str]] = {}
    for by_type in profiles.values():
        for t, p in by_type.items():
            src, var = out.setdefault(t, (set(), ""))
            src.add(p.source)
            out[t] = (src, var or getattr(p, "variant", "") or "")
    return out


def cluster_from_profiles(spec: str, profiles: Mapping[str, Mapping[str, Any]]) -> Cluster:
    """A SPEC (``h100:4,cpu:8``) whose types are defined by measured ``profiles``: every
    type the profiles name is planned in virtual time (the simulator's); built-in names
    keep their links, other names get DEFAULT_LINK_GBPS and DEFAULT_LINK_US (a cluster
    file states real ones). A name no profile has falls back to the built-in derived type
    or raises UnknownDeviceTypeError."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidParameterError(f"cluster spec must look like 'h100:4,cpu:8', got {spec!r}")
    known = _profile_types(profiles)
    counts: dict[str, int] = {}
    defs: dict[str, DeviceType] = {}
    for part in spec.split(","):
        name, _, num = part.strip().partition(":")
        key = name.strip().lower()
        if key in known:
            defs[key] = _measured_type(key, known[key][0], known[key][1])
        else:
            try:
                device_type(key)
            except UnknownDeviceTypeError:
                raise UnknownDeviceTypeError(
                    f"device type {name!r} has no block profile (profiled: "
                    f"{', '.join(sorted(known))}) and is not built in "
                    f"({', '.join(known_types())})") from None
        n = _spec_count(spec, name, num)
        counts[key] = counts.get(key, 0) + n
    return Cluster(tuple(counts.items()), tuple(defs.values()))


def _field(d: Mapping[str, Any], key: str, where: str, default: Any = None,
           positive: bool = False) -> float:
    x = d.get(key, default)
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)) \
            or not math.isfinite(float(x)) or x < 0 or (positive and x == 0):
        raise ProfileFormatError(f"{where}: {key} must be a finite number "
                                 f"{'> 0' if positive else '>= 0'}, got {x!r}")
    return float(x)


def parse_cluster_doc(doc: Any, profiles: Mapping[str, Mapping[str, Any]] | None = None,
                      where: str = "cluster file") -> Cluster:
    """A cluster file's document (docs/pipeline.md): device types with count,
    ``gpus_per_server``, ``link_gbps``, ``link_latency_us`` and optional ``fractions``."""
    if not isinstance(doc, dict) or doc.get("format") != CLUSTER_FORMAT:
        raise ProfileFormatError(f"{where}: not a cluster file (need \"format\": "
                                 f"\"{CLUSTER_FORMAT}\")")
    if doc.get("version") != CLUSTER_FORMAT_VERSION:
        raise ProfileFormatError(f"{where}: version {doc.get('version')!r}; this reader "
                                 f"knows {CLUSTER_FORMAT_VERSION}")
    unit = doc.get("bandwidth_unit", "gbps")
    if unit != "gbps":
        raise ProfileUnitsError(f"{where}: bandwidth_unit {unit!r}; links are given in "
                                "'gbps' (Gbit/s)")
    types = doc.get("device_types")
    if not isinstance(types, list) or not types:
        raise ProfileFormatError(f"{where}: device_types must be a non-empty list")
    known = _profile_types(profiles or {})
    counts: dict[str, int] = {}
    defs = []
    for i, t in enumerate(types):
        w = f"{where} device_types[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) \
                or not t["name"].strip():
            raise ProfileFormatError(f"{w}: needs a name")
        name = t["name"].strip().lower()
        if name in counts:
            raise ProfileFormatError(f"{w}: {name!r} given twice")
        count = t.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ProfileFormatError(f"{w}: count must be an integer >= 1, got {count!r}")
        gps = t.get("gpus_per_server", 1)
        if isinstance(gps, bool) or not isinstance(gps, int) or gps < 1:
            raise ProfileFormatError(f"{w}: gpus_per_server must be an integer >= 1, "
                                     f"got {gps!r}")
        gbps = _field(t, "link_gbps", w, positive=True)
        lat = _field(t, "link_latency_us", w, default=0.0)
        fr = t.get("fractions")
        if fr is not None:
            if not isinstance(fr, list) or not fr or any(
                    isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in fr):
                raise ProfileFormatError(f"{w}: fractions must list integers v >= 1 "
                                         f"(1/v of a device), got {fr!r}")
            fr = tuple(sorted(set(fr)))
        if name in known:
            dt = _measured_type(name, known[name][0], known[name][1], gbps, lat, gps, fr)
        else:
            try:
                base = device_type(name)
            except UnknownDeviceTypeError:
                raise UnknownDeviceTypeError(
                    f"{w}: device type {name!r} has no block profile (profiled: "
                    f"{', '.join(sorted(known)) or 'none'}) and is not built in "
                    f"({', '.join(known_types())})") from None
            dt = replace(base, link_gbps=gbps, link_us=lat, gpus_per_server=gps,
                         fractions=fr)
        counts[name] = count
        defs.append(dt)
    cluster = Cluster(tuple(counts.items()), tuple(defs))
    if len({t.simulated for t in cluster.types}) > 1:
        raise InvalidParameterError(f"{where} mixes simulated types and real cpu lanes")
    return cluster


def _spec_count(spec: str, name: str, num: str) -> int:
    """The count after ``name:`` in a cluster spec (1 when absent), an int >= 1."""
    try:
        n = int(num) if num.strip() else 1
    except ValueError:
        raise InvalidParameterError(
            f"cluster spec {spec!r}: count of {name!r} is not an integer: {num!r}") from None
    if n < 1:
        raise InvalidParameterError(f"cluster spec {spec!r}: count of {name!r} must be >= 1")
    return n


def load_cluster_file(path: str | os.PathLike[str],
                      profiles: Mapping[str, Mapping[str, Any]] | None = None) -> Cluster:
    return parse_cluster_doc(read_json(path), profiles, str(Path(path)))


def resolve_cluster(arg: str, profiles: Mapping[str, Mapping[str, Any]] | None = None
                    ) -> Cluster:
    """``--cluster FILE|SPEC``: a cluster file when ``arg`` names an existing file (or
    ends in ``.json``), else a SPEC, whose types come from ``profiles`` when given."""
    if isinstance(arg, str) and (arg.endswith(".json") or Path(arg).is_file()):
        return load_cluster_file(arg, profiles)
    if profiles:
        return cluster_from_profiles(arg, profiles)
    return parse_cluster(arg)
