"""Clusters of heterogeneous devices: ``SPEC`` strings like ``h100:25,orin:75`` or ``cpu:2``.

A device *type* says where its block profiles come from and how fast its network link is:

* simulated GPUs (every name in :data:`av_infer.profiles.GPUS`: ``mi50``, ``h100``,
  ``orin``): block latencies derived from the plans' geometry (roofline + occupancy), on
  the models' ``full`` variant; the cluster simulator runs them in virtual time;
* ``cpu``: real lanes; each member is an av_infer ``Runtime`` on the cpu device, block
  latencies measured with ONNX Runtime on the ``scaled`` variant.

Links: each physical device has an uplink and a downlink of ``link_gbps`` (virtual devices
of one physical device share them, which is where PPipe's network contention comes from)
and a fixed per-transfer cost ``link_us``.
"""

from __future__ import annotations

from dataclasses import dataclass

from av_infer.errors import InvalidParameterError
from av_infer.pipeline.errors import UnknownDeviceTypeError
from av_infer.profiles import GPUS


@dataclass(frozen=True)
class DeviceType:
    """One kind of device in a cluster; ``rank`` orders types from high to low class."""

    name: str
    simulated: bool
    variant: str  # zoo variant its profiles are taken on
    link_gbps: float
    link_us: float
    rank: float  # peak TFLOP/s for GPUs; the order in which "fastest" is decided


#: NIC bandwidth of the simulated GPU types: datacenter GPUs on 100 GbE, the embedded Orin
#: on 10 GbE (a vehicle's automotive Ethernet is in the same range).
_LINK_GBPS = {"h100": 100.0, "mi50": 25.0, "orin": 10.0}


def device_type(name: str) -> DeviceType:
    """The :class:`DeviceType` called ``name`` (case-insensitive); UnknownDeviceTypeError."""
    key = str(name).strip().lower()
    if key in GPUS:
        return DeviceType(key, True, "full", _LINK_GBPS.get(key, 25.0), 20.0,
                          GPUS[key].peak_tflops)
    if key == "cpu":
        # in-process hand-over or ROS 2 loopback: ~GB/s, a fraction of a ms per message
        return DeviceType("cpu", False, "scaled", 8.0, 200.0, 0.1)
    raise UnknownDeviceTypeError(
        f"unknown device type {name!r}; known: {', '.join(known_types())}")


def known_types() -> list[str]:
    return [*sorted(GPUS), "cpu"]


@dataclass(frozen=True)
class Cluster:
    """Device counts per type, in the order the spec gave them."""

    counts: tuple[tuple[str, int], ...]

    @property
    def types(self) -> list[DeviceType]:
        return [device_type(n) for n, _ in self.counts]

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
        return Cluster(tuple((t, c) for t, c in out if c > 0))


def parse_cluster(spec: str) -> Cluster:
    """``TYPE:COUNT[,TYPE:COUNT...]``; a bare ``TYPE`` means one device. Mixing simulated
    GPUs and real lanes in one cluster is refused (they do not share a clock)."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidParameterError(f"cluster spec must look like 'h100:4,orin:12', got {spec!r}")
    counts: dict[str, int] = {}
    for part in spec.split(","):
        name, _, num = part.strip().partition(":")
        dt = device_type(name)
        try:
            n = int(num) if num.strip() else 1
        except ValueError:
            raise InvalidParameterError(
                f"cluster spec {spec!r}: count of {name!r} is not an integer: {num!r}") from None
        if n < 1:
            raise InvalidParameterError(f"cluster spec {spec!r}: count of {name!r} must be >= 1")
        counts[dt.name] = counts.get(dt.name, 0) + n
    cluster = Cluster(tuple(counts.items()))
    if len({t.simulated for t in cluster.types}) > 1:
        raise InvalidParameterError(
            f"cluster spec {spec!r} mixes simulated GPUs and real lanes; use one kind")
    return cluster
