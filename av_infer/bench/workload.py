"""DISB workloads: parse DISB's JSON as is and turn each task's load into arrival times.

DISB (github.com/SJTU-IPADS/disb) describes a workload as ``tasks[]``, each with a
``load`` (``continuous`` | ``periodic`` | ``poisson`` | ``trace`` | ``dependent``) and a
``client`` (``model_name``, ``batch_size``, ...). DISB itself has no notion of RT/BE; the
REEF evaluation names its clients ``*_rt`` / ``*_be``. A task here is **RT** when

1. its load or client carries ``"rt": true|false`` (an av_infer extension), else
2. its ``id`` (or client name) ends in ``_rt`` / ``_be``, else
3. its load is not ``continuous`` (open-loop arrivals are RT, closed loops are BE).

Arrival schedules (seconds from the start of the measured window):

* ``periodic``: ``offset + k / frequency``. As DISB's ``builtinLoadCoordinator`` does,
  periodic loads with ``priority <= 0`` and equal frequency are staggered: each one starts
  after the sum of the standalone latencies of those before it (so five 20 req/s clients of
  DISB D do not all fire at the same instant).
* ``poisson``: exponential gaps with rate ``frequency``, from a generator seeded by
  ``(seed, task index)``: deterministic per seed, independent between tasks.
* ``trace``: the ``trace`` list of millisecond offsets, sorted (DISB ``TraceLoad``).
* ``continuous``: no schedule; a closed loop that resubmits on completion.
* ``dependent``: not supported (a clear :class:`WorkloadError`).

Every scheduled arrival becomes a request (open loop). DISB's own clients are synchronous
and skip frames that are already stale when the previous reply comes back; the harness does
not, so a late reply shows up as queueing latency instead of as fewer requests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: DISB workloads shipped in ``shared/disb/workloads``.
BUILTIN = ("A", "B", "C", "D", "E")
LOAD_TYPES = ("continuous", "periodic", "poisson", "trace", "dependent")


class WorkloadError(ValueError):
    """A workload file that cannot be run (unknown model, bad load, unsupported type)."""


@dataclass
class BenchTask:
    """One DISB task: a client sending requests for one model with one load."""

    id: str
    model_name: str  # DISB's name, e.g. "vgg19-imagenet"
    model: str  # zoo name, e.g. "vgg19"
    rt: bool
    load_type: str
    frequency: float = 0.0
    priority: int = 0
    trace_ms: list[float] = field(default_factory=list)
    batch_size: int = 1
    index: int = 0

    @property
    def open_loop(self) -> bool:
        """True when arrivals come from a schedule (periodic, poisson, trace)."""
        return self.load_type in ("periodic", "poisson", "trace")

    @property
    def period_s(self) -> float | None:
        """Mean interval between arrivals (None for closed loops)."""
        if self.load_type in ("periodic", "poisson") and self.frequency > 0:
            return 1.0 / self.frequency
        if self.load_type == "trace" and len(self.trace_ms) >= 2:
            return (self.trace_ms[-1] - self.trace_ms[0]) / 1e3 / (len(self.trace_ms) - 1)
        return None

    def arrivals(self, duration: float, seed: int = 0, offset: float = 0.0) -> list[float]:
        """Scheduled arrival times in ``[0, duration)`` (seconds); [] for closed loops."""
        if self.load_type == "periodic":
            if self.frequency <= 0:
                return []
            n = math.ceil((duration - offset) * self.frequency)
            times = [offset + k / self.frequency for k in range(max(0, n))]
        elif self.load_type == "poisson":
            if self.frequency <= 0:
                return []
            rng = np.random.default_rng([seed, self.index])
            times, t = [], 0.0
            while True:
                t += float(rng.exponential(1.0 / self.frequency))
                if t >= duration:
                    break
                times.append(t)
        elif self.load_type == "trace":
            times = [ms / 1e3 for ms in self.trace_ms]
        else:
            return []
        return [t for t in times if 0.0 <= t < duration]


@dataclass
class Workload:
    """A parsed DISB workload."""

    name: str
    tasks: list[BenchTask]
    time_s: float = 60.0
    source: str = ""
    rate_scale: float = 1.0

    def scaled(self, factor: float) -> Workload:
        """Open-loop arrival rates times ``factor`` (trace offsets divided by it): keeps a
        slow device (cpu) out of permanent overload. Closed loops are unchanged."""
        if not factor > 0:
            raise WorkloadError(f"rate scale must be > 0, got {factor!r}")
        tasks = [BenchTask(**{**t.__dict__, "frequency": t.frequency * factor,
                              "trace_ms": [x / factor for x in t.trace_ms]})
                 for t in self.tasks]
        return Workload(name=self.name, tasks=tasks, time_s=self.time_s, source=self.source,
                        rate_scale=self.rate_scale * factor)

    @property
    def rt_tasks(self) -> list[BenchTask]:
        return [t for t in self.tasks if t.rt]

    @property
    def be_tasks(self) -> list[BenchTask]:
        return [t for t in self.tasks if not t.rt]

    @property
    def models(self) -> list[str]:
        """Zoo names of every model the workload uses, in first-use order."""
        return list(dict.fromkeys(t.model for t in self.tasks))

    def periodic_offsets(self, standalone_s: dict[str, float]) -> dict[str, float]:
        """Start offsets of periodic RT loads (DISB's coordinator; see module docstring)."""
        offsets: dict[str, float] = {}
        acc: dict[float, float] = {}
        for t in self.tasks:
            if t.load_type != "periodic" or t.priority > 0:
                continue
            offsets[t.id] = acc.get(t.frequency, 0.0)
            acc[t.frequency] = offsets[t.id] + standalone_s.get(t.model, 0.0)
        return offsets


def shared_dir() -> Path:
    """``shared/`` beside the repository (or inside it)."""
    root = Path(__file__).resolve().parents[2]
    for cand in (root.parent / "shared", root / "shared"):
        if cand.is_dir():
            return cand
    return root.parent / "shared"


def workload_path(name: str) -> Path:
    """A builtin name (A..E, REAL if present) or a path to a JSON file."""
    p = Path(name)
    if p.suffix == ".json" or p.exists():
        if not p.is_file():
            raise WorkloadError(f"workload file {name!r} does not exist")
        return p
    cand = shared_dir() / "disb" / "workloads" / f"{name.upper()}.json"
    if not cand.is_file():
        raise WorkloadError(
            f"unknown workload {name!r}: use one of {', '.join(BUILTIN)} or a DISB JSON file"
        )
    return cand


def _is_rt(task_id: str, client: dict[str, Any], load: dict[str, Any]) -> bool:
    for d in (load, client):
        if "rt" in d:
            return bool(d["rt"])
    for s in (task_id, str(client.get("name", ""))):
        low = s.lower()
        if low.endswith("_rt"):
            return True
        if low.endswith("_be"):
            return False
    return load.get("type") != "continuous"


def parse_workload(doc: dict[str, Any], name: str = "workload") -> Workload:
    """Parse a DISB workload document (``{"time": s, "tasks": [...]}``)."""
    from av_infer.model import zoo

    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), list) or not doc["tasks"]:
        raise WorkloadError(f"{name}: a DISB workload needs a non-empty 'tasks' list")
    tasks: list[BenchTask] = []
    for i, raw in enumerate(doc["tasks"]):
        load = raw.get("load") or {}
        client = raw.get("client") or {}
        tid = str(raw.get("id") or client.get("name") or f"task{i}")
        ltype = load.get("type")
        if ltype not in LOAD_TYPES:
            raise WorkloadError(f"{name}: task {tid!r}: unknown load type {ltype!r}")
        if ltype == "dependent":
            raise WorkloadError(
                f"{name}: task {tid!r}: 'dependent' loads (DAGs of tasks) are not supported "
                "by av-infer bench; use periodic, poisson, trace or continuous")
        mname = client.get("model_name")
        if not mname:
            raise WorkloadError(f"{name}: task {tid!r} has no client.model_name")
        model = zoo.DISB_MODELS.get(mname, mname if mname in zoo.names() else None)
        if model is None:
            raise WorkloadError(
                f"{name}: task {tid!r}: unknown model {mname!r}; "
                f"known: {', '.join(sorted(zoo.DISB_MODELS))}")
        freq = float(load.get("frequency", 0.0) or 0.0)
        if ltype in ("periodic", "poisson") and freq <= 0:
            raise WorkloadError(f"{name}: task {tid!r}: {ltype} load needs frequency > 0")
        trace: list[float] = []
        if ltype == "trace":
            tr = load.get("trace")
            if not isinstance(tr, list) or not tr:
                raise WorkloadError(f"{name}: task {tid!r}: trace load needs a 'trace' list")
            try:
                trace = sorted(float(x) for x in tr)
            except (TypeError, ValueError):
                raise WorkloadError(
                    f"{name}: task {tid!r}: 'trace' must be numbers (ms offsets)") from None
        tasks.append(BenchTask(
            id=tid, model_name=mname, model=model, rt=_is_rt(tid, client, load),
            load_type=ltype, frequency=freq, priority=int(load.get("priority", 0) or 0),
            trace_ms=trace, batch_size=int(client.get("batch_size", 1) or 1), index=i,
        ))
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise WorkloadError(f"{name}: task ids are not unique: {ids}")
    return Workload(name=name, tasks=tasks, time_s=float(doc.get("time", 60) or 60))


def load_workload(name_or_path: str) -> Workload:
    """Read a builtin DISB workload (A..E) or a DISB JSON file."""
    p = workload_path(name_or_path)
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise WorkloadError(f"{p}: not valid JSON: {e}") from None
    label = p.stem if p.parent.name == "workloads" and p.stem in BUILTIN else str(p)
    wl = parse_workload(doc, name=label)
    wl.source = str(p)
    return wl


def read_trace(path: str | Path) -> list[float]:
    """A trace file: a JSON list of ms offsets, or an object with a ``trace`` list."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise WorkloadError(f"trace {path}: {e}") from None
    tr = doc.get("trace") if isinstance(doc, dict) else doc
    if not isinstance(tr, list) or not tr:
        raise WorkloadError(f"trace {path}: expected a list of millisecond offsets")
    try:
        return sorted(float(x) for x in tr)
    except (TypeError, ValueError):
        raise WorkloadError(f"trace {path}: offsets must be numbers") from None


def with_trace(wl: Workload, trace_ms: list[float], label: str = "trace") -> Workload:
    """The same workload with every RT task driven by ``trace_ms`` (DISB ``trace`` load)."""
    tasks = []
    for t in wl.tasks:
        if t.rt:
            t = BenchTask(**{**t.__dict__, "load_type": "trace", "trace_ms": list(trace_ms),
                             "frequency": 0.0})
        tasks.append(t)
    return Workload(name=f"{wl.name}+{label}", tasks=tasks, time_s=wl.time_s, source=wl.source,
                    rate_scale=wl.rate_scale)


def expand(names: str) -> list[str]:
    """``all`` -> A..E; ``A,C`` -> [A, C]; a path stays itself."""
    if names.lower() == "all":
        return list(BUILTIN)
    return [n for n in names.split(",") if n]
