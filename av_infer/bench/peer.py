"""``av-infer bench --peer ort``: av_infer against what a user writes in an afternoon.

One load, three systems, one run, the same client code:

* ``avi``: av_infer (``Runtime(device="cpu")`` with the chosen policy); the RT model loaded
  pinned (whole), the BE model cut into preemptible segments;
* ``ort_threads``: one ONNX Runtime session per model, a thread per client (the RT thread at
  default priority), the same intra-op thread count per session;
* ``ort_rt_alone``: the RT model alone in ONNX Runtime (the latency floor).

The load: one periodic RT client (``rt_rate`` Hz; latency = completion seen by the client
minus the *scheduled* arrival, so a late start counts) and ``be_clients`` closed-loop BE
clients (each submits its next request when the previous one returned). After ``warmup``
seconds, ``duration`` seconds are measured. Wall-clock numbers on a shared machine: compare
the systems of one run, not runs across machines.

``rounds``: the measured time is split into that many rounds, the systems taking turns
within each (ABBA order: the order reverses every round), each system's sessions or runtime
kept open between its turns. On a machine whose speed drifts by tens of percent within
minutes (a shared VM), one long run per system compares two different machines; turns
expose every system to the same drift. Percentiles pool every round's samples, BE req/s is
all requests over all measured time; ``per_round`` keeps each round's figures and
``ratios_range`` the spread of the per-round ratios.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["PeerConfig", "run_peer", "format_peer", "resolve_model", "add_load_args",
           "machine_info", "beside_others", "host_busy_s"]


@dataclass
class PeerConfig:
    rt_model: str = "resnet152"
    be_model: str = "vgg19"
    rt_shape: Any = None  # input shapes for ONNX paths (like --input-shape)
    be_shape: Any = None
    rt_rate: float = 20.0
    be_clients: int = 2
    policy: str = "reef"
    c: int = 4
    duration: float = 10.0
    warmup: float = 1.0
    threads: int = 1
    device_options: dict[str, Any] = field(default_factory=dict)
    systems: tuple[str, ...] = ("ort_rt_alone", "ort_threads", "avi")
    progress: bool = True
    #: rounds the systems take turns in (see the module docstring); 1: one run each
    rounds: int = 1


@dataclass
class _Model:
    label: str
    source: str
    shapes: Any
    inputs: dict[str, np.ndarray]


def add_load_args(ap: Any, be_clients: int = 2) -> None:
    """The load options of the scripts that drive the peer's load (``scripts/gc_pauses.py``,
    ``scripts/rt_client_lateness.py``): models, RT rate, BE clients, policy, ``--json``."""
    ap.add_argument("--rt-model", default="resnet152")
    ap.add_argument("--be-model", default="vgg19")
    ap.add_argument("--rt-rate", type=float, default=20.0)
    ap.add_argument("--be-clients", type=int, default=be_clients)
    ap.add_argument("--policy", default="reef_dkp")
    ap.add_argument("--json", help="write the figures here ('-': stdout)")


def resolve_model(spec: str, shapes: Any = None) -> _Model:
    """A zoo name (scaled variant), an exported model name (``model.exported``: ocr_det,
    ocr_rec, ocr_cls, at their CPU-table shapes unless ``shapes``), or an ONNX path
    (dynamic dims bound by ``shapes``)."""
    from av_infer.model import exported, zoo

    if spec in zoo.names():
        return _Model(spec, str(zoo.path(spec, "scaled")), None, zoo.sample_inputs(spec))
    label = os.path.splitext(os.path.basename(spec))[0]
    if spec in exported.names():
        label, shapes = spec, shapes or list(exported.input_shape(spec))
        spec = exported.as_path_str(spec)
    from av_infer.model.check import random_inputs
    from av_infer.model.onnx_import import bind_inputs, load_model

    m = load_model(spec)
    spec_in = {n: (v.shape, v.dtype) for n, v in bind_inputs(m, shapes).items()}
    return _Model(label, spec, shapes, random_inputs(spec_in, seed=0))


def machine_info() -> dict[str, Any]:
    """The host a peer comparison ran on, as its report records it: CPUs, platform, Python,
    and CPython's GIL switch interval (``gil_switch_interval_s``: how long a thread that
    wants the GIL waits before the holder is asked to drop it; ``bench
    --switch-interval-us`` changes it for a run), since a Python client's lateness under
    load depends on it."""
    import sys

    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(),
            "gil_switch_interval_s": sys.getswitchinterval()}


def _summary(raw: _Raw) -> dict[str, Any]:
    """RT latency distribution (``rt_<p50|p90|p99|p999|mean|max>_ms``), BE rate, the cores
    the process used while measuring (``cores_used``: CPU seconds over wall seconds; only
    the measured system runs then), the cores *other processes* used meanwhile
    (``other_cores``: the host's busy time from ``/proc/stat`` less this process's; None
    where the host does not say: a comparison beside other work reads differently, since
    BE lanes at ``be_nice`` yield to them, docs/cpu_engine.md "Beside other processes") and
    how late the RT client called (``rt_late_p50_ms``, ``rt_late_p99_ms``: after the
    scheduled arrival, before the system knew of it)."""
    from av_infer.bench.metrics import dist

    w = raw.window
    out: dict[str, Any] = {"rt_n": len(raw.lat), "be_done": int(raw.be_done),
                           "be_rps": raw.be_done / w if w > 0 else 0.0,
                           "cores_used": raw.cpu_s / w if w > 0 else 0.0,
                           "other_cores": (max(0.0, (raw.host_s - raw.cpu_s) / w)
                                           if w > 0 and raw.host_s >= 0 else None)}
    out.update({f"rt_{k}_ms": v for k, v in dist(raw.lat, 1e3).items()})
    late = dist(raw.late, 1e3)
    out.update({f"rt_late_{k}_ms": late[k] for k in ("p50", "p99")})
    return out


@dataclass
class _Raw:
    """What one system's measured rounds left: RT latencies (s), BE completions, time,
    and how late the RT client called (s after the scheduled arrival, before the runtime
    could know of the request)."""

    lat: list[float] = field(default_factory=list)
    be_done: int = 0
    window: float = 0.0
    late: list[float] = field(default_factory=list)
    cpu_s: float = 0.0  # the process's CPU time (user + system) while measuring
    host_s: float = 0.0  # the host's busy CPU time meanwhile (all processes; < 0: unknown)

    def add(self, other: _Raw) -> None:
        self.lat += other.lat
        self.be_done += other.be_done
        self.window += other.window
        self.late += other.late
        self.cpu_s += other.cpu_s
        self.host_s = -1.0 if min(self.host_s, other.host_s) < 0 else self.host_s + other.host_s


def _drive(rt_infer: Callable[[float], None], be_infer: list[Callable[[], None]],
           cfg: PeerConfig, label: str, duration: float | None = None) -> _Raw:
    """Run the load (``duration`` measured seconds, ``cfg.duration`` if None): the RT loop
    on this thread, one thread per BE client."""
    period = 1.0 / cfg.rt_rate
    stop = threading.Event()
    t_meas = [0.0, 0.0]
    cpu = [0.0, 0.0]
    host = [0.0, 0.0]
    counts = [0] * len(be_infer)
    measuring = threading.Event()
    errors: list[BaseException] = []

    def be_loop(i: int, fn: Callable[[], None]) -> None:
        try:
            while not stop.is_set():
                fn()
                if measuring.is_set():
                    counts[i] += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            stop.set()

    ths = [threading.Thread(target=be_loop, args=(i, f), daemon=True, name=f"peer-be{i}")
           for i, f in enumerate(be_infer)]
    for th in ths:
        th.start()
    lat: list[float] = []
    late: list[float] = []
    now = time.perf_counter
    t0 = now() + 0.05
    n_warm = int(cfg.warmup * cfg.rt_rate)
    dur = cfg.duration if duration is None else duration
    n_total = n_warm + max(1, int(dur * cfg.rt_rate))
    bar = _bar(n_total, label, cfg.progress)
    try:
        for i in range(n_total):
            sched = t0 + i * period
            dt = sched - now()
            if dt > 0:
                time.sleep(dt)
            if i == n_warm:
                measuring.set()
                t_meas[0], cpu[0], host[0] = now(), _cpu_s(), host_busy_s()
            t_call = now()
            rt_infer(sched)
            if i >= n_warm:
                lat.append(now() - sched)
                late.append(t_call - sched)
            if bar is not None:
                bar.update(1)
            if errors:
                break
    finally:
        t_meas[1], cpu[1], host[1] = now(), _cpu_s(), host_busy_s()
        measuring.clear()
        stop.set()
        for th in ths:
            th.join()
        if bar is not None:
            bar.close()
    if errors:
        raise RuntimeError(f"{label}: a BE client failed: {errors[0]!r}") from errors[0]
    busy = -1.0 if min(host) < 0 else host[1] - host[0]
    return _Raw(lat, sum(counts), t_meas[1] - t_meas[0], late, cpu[1] - cpu[0], busy)


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def host_busy_s() -> float:
    """CPU seconds the whole host has been busy since boot (every process, all cores:
    ``/proc/stat``'s user, nice, system, irq, softirq and steal), -1.0 where it cannot be
    read. The difference over a window, less this process's own CPU time, is what other
    processes took."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        if fields[0] != "cpu":
            return -1.0
        ticks = [int(v) for v in fields[1:9]]
        busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6] + ticks[7]
        return busy / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return -1.0


def _bar(n: int, label: str, on: bool) -> Any:
    if not on:
        return None
    from tqdm import tqdm

    return tqdm(total=n, desc=f"peer {label}", unit="rt", leave=False)


def _ort_session(source: str, threads: int) -> Any:
    import onnxruntime as ort

    from av_infer.model.segments import ort_options

    return ort.InferenceSession(source, ort_options(threads), providers=["CPUExecutionProvider"])


#: what an opened system gives the rounds: (rt_infer, be_fns, finish); ``finish(out)`` adds
#: the system's own figures to its summary before it is closed
_Opened = tuple[Callable[[float], None], list[Callable[[], None]],
                Callable[[dict[str, Any]], None]]


def _open_ort(rt: _Model, be: _Model | None, cfg: PeerConfig, stack: ExitStack) -> _Opened:
    """One ORT session per model, a thread per client (what a user writes first)."""
    rs = _ort_session(rt.source, cfg.threads)
    for _ in range(5):
        rs.run(None, rt.inputs)
    be_fns: list[Callable[[], None]] = []
    if be is not None:
        bs = _ort_session(be.source, cfg.threads)
        bs.run(None, be.inputs)
        be_fns = [lambda bs=bs: bs.run(None, be.inputs) for _ in range(cfg.be_clients)]
    return (lambda _sched: rs.run(None, rt.inputs)), be_fns, lambda out: None


def _open_avi(rt: _Model, be: _Model, cfg: PeerConfig, stack: ExitStack) -> _Opened:
    """The same clients through one av_infer Runtime on the cpu device."""
    from av_infer import Runtime

    opts = {"threads": cfg.threads, **cfg.device_options}
    # BE lanes: one per client up to one per core (more would only oversubscribe the cores;
    # further BE requests queue, round-robin between clients)
    lanes = max(1, min(cfg.be_clients, os.cpu_count() or 1))
    r = stack.enter_context(Runtime("cpu", policy=cfg.policy, c=cfg.c,
                                    max_be_streams=lanes, device_options=opts))
    r.load_model("rt", rt.source, rt.shapes, pin=True)
    r.load_model("be", be.source, be.shapes)
    r.configure_client("rt", "RT", relative_deadline=1.0 / cfg.rt_rate)
    for _ in range(5):
        r.submit("rt", rt.inputs, priority="RT", client="warm").result()
    r.submit("be", be.inputs, client="warm").result()

    def rt_infer(sched: float) -> None:
        r.infer("rt", rt.inputs, client="rt", arrival=sched)

    be_fns = [lambda c=f"be{i}": r.infer("be", be.inputs, client=c)
              for i in range(cfg.be_clients)]

    def finish(out: dict[str, Any]) -> None:
        st = r.stats()
        for key, stat in (("preemption_ms", "preemption_stop_ms"),
                          ("preemption_observed_ms", "preemption_observed_ms"),
                          ("preemption_from_submit_ms", "preemption_stop_from_submit_ms")):
            d = st.get(stat, {})
            out[key] = {k: d.get(k) for k in ("p50", "p99", "max", "count")}
        out["preemptions"] = st.get("preemptions")
        dev = st.get("device", {})
        out["killed"] = sum(s.get("killed", 0) for s in dev.get("streams", []))
        out["kill_ms"] = dev.get("kill_ms")
        out["policy"] = cfg.policy
        out["be_lanes"] = lanes

    return rt_infer, be_fns, finish


def _open(system: str, rt: _Model, be: _Model, cfg: PeerConfig, stack: ExitStack) -> _Opened:
    if system == "ort_rt_alone":
        return _open_ort(rt, None, cfg, stack)
    if system == "ort_threads":
        return _open_ort(rt, be, cfg, stack)
    if system == "avi":
        return _open_avi(rt, be, cfg, stack)
    raise ValueError(f"unknown system {system!r}")


#: RT periods a round must span at least: the measured window is a whole number of RT
#: periods (``_drive``), so a round shorter than this measures a moment, not a rate
MIN_RT_PERIODS = 2


def check_load(cfg: PeerConfig) -> None:
    """ValueError naming the setting when ``cfg`` cannot be measured: a round (``duration /
    rounds``) must span at least ``MIN_RT_PERIODS`` RT periods (at 0.5 Hz, 6 s in 2 rounds
    measured one RT call and the BE requests of its 50 ms: ratios of 0.16-0.30 that said
    nothing)."""
    if not cfg.rt_rate > 0 or not cfg.duration > 0 or cfg.rounds < 1:
        raise ValueError("rt_rate and duration must be > 0 and rounds >= 1")
    periods = cfg.duration / cfg.rounds * cfg.rt_rate
    if periods < MIN_RT_PERIODS:
        raise ValueError(
            f"each round spans {periods:g} RT periods ({cfg.duration:g} s in {cfg.rounds} "
            f"rounds at {cfg.rt_rate:g} Hz); at least {MIN_RT_PERIODS} are needed: raise "
            f"duration to {MIN_RT_PERIODS * cfg.rounds / cfg.rt_rate:g} s or more, or the "
            "RT rate")


def run_peer(cfg: PeerConfig) -> dict[str, Any]:
    """Run every system of ``cfg.systems`` on the same load; the report dict (ValueError
    first, nothing run, for a load :func:`check_load` refuses)."""
    from av_infer.model.segments import compile_segments

    check_load(cfg)

    rt = resolve_model(cfg.rt_model, cfg.rt_shape)
    be = resolve_model(cfg.be_model, cfg.be_shape)
    doc: dict[str, Any] = {
        "kind": "peer",
        "peer": "ort",
        "config": {k: v for k, v in asdict(cfg).items() if k != "progress"},
        "rt_model": rt.label,
        "be_model": be.label,
        "machine": machine_info(),
        "command": None,
    }
    seg_ms = cfg.device_options.get("segment_ms")
    seg = compile_segments(be.source, be.shapes, name=be.label,
                           **({} if seg_ms is None else {"segment_ms": float(seg_ms)}))
    doc["be_segments"] = seg.stats.get("segments")
    rounds = max(1, int(cfg.rounds))
    each = cfg.duration / rounds
    raw = {sysname: _Raw() for sysname in cfg.systems}
    per_round: list[dict[str, Any]] = []
    with ExitStack() as stack:
        opened = {sysname: _open(sysname, rt, be, cfg, stack) for sysname in cfg.systems}
        for i in range(rounds):
            order = list(cfg.systems) if i % 2 == 0 else list(reversed(cfg.systems))
            row: dict[str, Any] = {"round": i}
            for sysname in order:
                rt_infer, be_fns, _ = opened[sysname]
                label = sysname if rounds == 1 else f"{sysname} {i + 1}/{rounds}"
                got = _drive(rt_infer, be_fns, cfg, label, duration=each)
                raw[sysname].add(got)
                one = _summary(got)
                row[sysname] = {k: one[k] for k in ("rt_p50_ms", "rt_p99_ms", "be_rps")}
            if "avi" in row and "ort_threads" in row:
                row["ratios"] = _ratios(row["avi"], row["ort_threads"])
            per_round.append(row)
        for sysname in cfg.systems:
            out = _summary(raw[sysname])
            opened[sysname][2](out)
            doc[sysname] = out
    a, o = doc.get("avi"), doc.get("ort_threads")
    if a and o:
        doc["ratios"] = _ratios(a, o)
    doc["rounds"] = rounds
    if rounds > 1:
        doc["per_round"] = per_round
        rs = [r["ratios"] for r in per_round if "ratios" in r]
        if rs:
            doc["ratios_range"] = {k: [min(v), max(v)] for k in rs[0]
                                   if None not in (v := [x[k] for x in rs])}
    return doc


def peer_command(cfg: PeerConfig, extra: list[str] | None = None) -> str:
    """The ``av-infer bench --peer ort`` command line that repeats ``cfg``'s load (models,
    rate, clients, policy, timing), with ``extra`` arguments appended (input shapes and
    device options as they were typed). Runs all three systems, whatever ``cfg.systems``."""
    import shlex

    cmd = ["av-infer", "bench", "--peer", "ort", "--rt-model", cfg.rt_model, "--be-model",
           cfg.be_model, "--rt-rate", f"{cfg.rt_rate:g}", "--be-clients", str(cfg.be_clients),
           "--policy", cfg.policy, "--c", str(cfg.c), "--duration", f"{cfg.duration:g}",
           "--warmup", f"{cfg.warmup:g}", "--threads", str(cfg.threads),
           "--rounds", str(cfg.rounds), *(extra or [])]
    return " ".join(shlex.quote(a) for a in cmd)


def _ratios(a: dict[str, Any], o: dict[str, Any]) -> dict[str, float | None]:
    return {"rt_p99": _ratio(a["rt_p99_ms"], o["rt_p99_ms"]),
            "rt_p50": _ratio(a["rt_p50_ms"], o["rt_p50_ms"]),
            "be_rps": _ratio(a["be_rps"], o["be_rps"])}


def _ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or not y else float(x) / float(y)


def fmt_num(v: Any, nd: int = 2) -> str:
    """A figure of a peer table: ``nd`` decimals, ``-`` when missing."""
    return "-" if v is None else f"{v:.{nd}f}"


def format_peer(doc: dict[str, Any]) -> str:
    """The comparison table (and ratios) as text. ``late p99``: how late the RT client
    thread called after its scheduled arrival (the part of ``preempt p99``, measured from
    that arrival, before the runtime knew of the request; ``from submit`` is the rest)."""
    cfg = doc["config"]
    lines = [f"peer comparison: RT {doc['rt_model']} @ {cfg['rt_rate']:g} Hz, "
             f"{cfg['be_clients']} closed-loop BE clients on {doc['be_model']} "
             f"({doc.get('be_segments')} segments in avi), policy {cfg['policy']}, "
             f"{cfg['threads']} intra-op thread(s) per session, {cfg['duration']:g} s"
             + (f" in {doc['rounds']} interleaved rounds" if doc.get("rounds", 1) > 1 else ""),
             f"{'system':<14}{'RT p50 ms':>10}{'p99':>8}{'p99.9':>8}{'max':>8}{'RT n':>7}"
             f"{'BE req/s':>10}{'cores':>7}{'others':>7}{'late p99':>10}"
             f"{'preempt p99 ms':>16}{'from submit':>13}"]
    for s in ("avi", "ort_threads", "ort_rt_alone"):
        r = doc.get(s)
        if not r:
            continue
        pre = (r.get("preemption_ms") or {}).get("p99")
        pre_sub = (r.get("preemption_from_submit_ms") or {}).get("p99")
        lines.append(f"{s:<14}{fmt_num(r['rt_p50_ms']):>10}{fmt_num(r['rt_p99_ms']):>8}"
                     f"{fmt_num(r['rt_p999_ms']):>8}{fmt_num(r['rt_max_ms']):>8}{r['rt_n']:>7}"
                     f"{r['be_rps']:>10.1f}{fmt_num(r.get('cores_used')):>7}"
                     f"{fmt_num(r.get('other_cores')):>7}"
                     f"{fmt_num(r.get('rt_late_p99_ms'), 3):>10}{fmt_num(pre, 3):>16}"
                     f"{fmt_num(pre_sub, 3):>13}")
    ra = doc.get("ratios")
    if ra:
        lines.append(f"avi / ort_threads: RT p99 {fmt_num(ra['rt_p99'])}x, RT p50 "
                     f"{fmt_num(ra['rt_p50'])}x, BE req/s {fmt_num(ra['be_rps'])}x")
    rr = doc.get("ratios_range")
    if rr:
        lines.append("per round: " + ", ".join(
            f"{k} {fmt_num(v[0])}-{fmt_num(v[1])}x" for k, v in rr.items()))
    others = beside_others(doc)
    if others is not None:
        lines.append(f"other processes used {others:.2f} cores while av_infer ran: BE lanes "
                     "at be_nice yield to them (docs/cpu_engine.md \"Beside other processes\")")
    return "\n".join(lines)


#: cores other processes used during av_infer's turns above which a comparison says so
OTHERS_NOTE_CORES = 0.25


def beside_others(doc: dict[str, Any]) -> float | None:
    """The cores other processes used while av_infer ran (``avi.other_cores``) where that is
    at least ``OTHERS_NOTE_CORES``, else None: a report beside other work says it was."""
    v = (doc.get("avi") or {}).get("other_cores")
    return v if v is not None and v >= OTHERS_NOTE_CORES else None
