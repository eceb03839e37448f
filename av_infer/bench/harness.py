"""Run one DISB workload under one policy on one device; return raw per-request records.

Order of a benchmark (``Bench``):

1. resolve every model of the workload to a source (``ModelSource``): on ``sim`` a
   measured profile from ``profiles`` (``--profiles DIR``) with the zoo plan it was
   measured on, else the REEF kernel trace where one exists (measured on an MI50;
   ``sim_models="zoo"`` skips them), else the zoo's full-size plan with a profile derived
   from its geometry; on ``cpu``/``cuda`` the zoo ONNX file (``scaled`` by default on cpu,
   ``full`` on cuda). ``ModelSource.profile_source`` says which (measured, reef-trace,
   derived, derived-scaled);
2. ``standalone()``: each RT model alone under ``rt_only``, a few warm-up requests then
   ``standalone_n`` back-to-back requests; the median is the latency reference;
3. ``run_policy(name)``: a fresh runtime (and a fresh simulator: runs are independent and
   deterministic for a seed), warm-up, then the mix for ``duration`` seconds. Open-loop
   clients submit at their scheduled arrival with ``arrival=`` that time (a late submitter
   still has its latency counted from the schedule); closed-loop clients resubmit from
   the completion callback until the window closes. Every RT request that arrived inside
   the window is waited for; BE requests still running at the end are drained too.

Under ``rt_only`` the BE clients are not started (the policy rejects BE work).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from av_infer.bench.metrics import Record, Residency, standalone_stats
from av_infer.bench.plots import Timeline
from av_infer.bench.workload import BenchTask, Workload
from av_infer.devices import DEVICE_NAMES

#: DISB zoo name -> REEF trace model (shared/reef-kernel-traces); inception_v3 has none.
REEF_TRACES = {"vgg19": "vgg", "resnet152": "resnet152", "densenet201": "densenet",
               "distilbert": "bert"}


def available_policies(device: str = "sim") -> list[str]:
    """Policies of this build that ``device`` can run (what ``all`` means there)."""
    from av_infer.devices import device_class
    from av_infer.sched.policies import POLICIES, device_refuses

    cls = device_class(device)
    return [p.name for p in POLICIES.values()
            if p.available and device_refuses(p, cls) is None]


@dataclass
class BenchConfig:
    """Knobs of one benchmark (see ``av-infer bench --help``)."""

    device: str = "sim"  # sim | cpu | cuda
    duration: float = 5.0  # seconds of the measured window (virtual on sim)
    seed: int = 0
    scale: str | None = None  # zoo variant; None: scaled on cpu, full elsewhere
    c: int = 4
    preempt_drain: bool = False  # reef: RT only after the <= c launched BE kernels drained
    gpu: str = "mi50"  # simulated GPU
    deadline_ms: float | None = None  # relative deadline of every RT client
    standalone_n: int = 20
    warmup: int = 3
    progress: bool = True
    timeline: bool = True  # capture kernels around one preemption
    #: sim: memory-side contention model (devices.sim_contention.MODELS)
    contention: str = "calibrated"
    #: sim: host model (devices.sim_host): None/"none" off, a parameter FILE.json (or a
    #: sim_host.HostModel)
    host: str | None = None
    #: sim: what a padded launch costs the RT kernel per model (devices.sim_pad): None
    #: REEF's GpuSpec.pad_overhead, a parameter FILE.json (or a sim_pad.PadModel)
    pad: str | None = None
    #: sim: where a padded grid's blocks go ("faithful"; "reserved" is a what-if)
    dkp_placement: str = "faithful"
    #: Runtime(be_min_share=...): 0 is REEF's strict RT priority (what DISB compares);
    #: the runtime's own default (0.1) grants BE a share while RT is over capacity
    be_min_share: float = 0.0
    #: hold BE kernels across forecast RT arrivals (sched.rt_forecast.QuietWindows);
    #: only under policies that preempt
    rt_forecast: bool = False
    #: the quiet windows' RT latency budget (sched.rt_forecast.BUDGET by default)
    forecast_budget: float | None = None
    #: sim: a directory of measured kernel profiles (profiles.load_profile_dir); models
    #: found there are simulated with them, the others as before
    profiles: str | None = None
    #: sim: "reef" (REEF traces where one exists, the default) or "zoo" (the zoo plans
    #: for every model: what the cuda device runs, so what bench.compare_sim needs)
    sim_models: str = "reef"
    #: sim: per model, a factor on its derived profile's durations (compare_sim's
    #: standalone calibration); models with measured profiles or REEF traces ignore it
    profile_scale: dict[str, float] | None = None
    #: every model's ``Runtime.load_model(precision=)``: fp32 | tf32 | fp16; the device
    #: must run it (``Runtime.precisions``: cpu and sim fp32 only), else InvalidParameterError
    precision: str = "fp32"

    @property
    def variant(self) -> str:
        if self.scale:
            return self.scale
        return "scaled" if self.device in ("cpu", "cuda-emu") else "full"


@dataclass
class ModelSource:
    """Where a model's plan (and on sim its timing profile) came from."""

    model: str
    source: str  # e.g. "reef-trace:vgg (MI50 measured)", "zoo:vgg19/scaled"
    plan: Any = None  # Plan (sim) or None (load from path)
    path: str | None = None
    profile: Any = None
    kernels: int = 0
    #: sim: where the timing profile came from (profiles.PROFILE_SOURCES); "" elsewhere
    profile_source: str = ""

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source, "kernels": self.kernels}
        if self.profile_source:
            d["profile"] = self.profile_source
        return d


@dataclass
class PolicyRun:
    """Raw outcome of one policy on one workload."""

    policy: str
    c: int
    records: list[Record]
    t0: float
    duration: float
    preemptions: int = 0
    events: dict[str, int] = field(default_factory=dict)
    timeline: Timeline | None = None
    wall_s: float = 0.0
    #: when BE work occupied the device (preemption latency); None if not observed
    residency: Residency | None = None
    #: device telemetry at the end of the run (sim: batches, contention, placement)
    device: dict[str, Any] = field(default_factory=dict)
    #: the run's name in the report: the policy, "+forecast" with quiet windows
    label: str = ""
    rt_forecast: bool = False


class TimelineCapture:
    """Listener keeping the kernels of a window around the first preemption after ``after``.

    Kernel events arrive at completion; the last ``half_window`` seconds are kept in a
    deque until a preemption happens, then events are collected until the window's end.
    """

    def __init__(self, after: float, half_window: float, policy: str) -> None:
        self.after = after
        self.half = half_window
        self.policy = policy
        self.recent: deque[tuple[int, int, int, bool | None, float, float, bool]] = deque()
        self.rt_tasks: set[int] = set()
        self.t_preempt: float | None = None
        self.done = False

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if self.done:
            return
        if event in ("dispatch", "arrival"):
            tid = data.get("task", data.get("request_id"))
            if _is_rt_event(data) and tid is not None:
                self.rt_tasks.add(int(tid))
            return
        if event == "preempt":
            t = _event_time(data)
            if (self.t_preempt is None and t is not None and t >= self.after
                    and data.get("kind") != "edf"):
                self.t_preempt = t
            return
        if event != "kernel":
            return
        task = int(data.get("task", -1))
        ts, te = float(data.get("t_start", math.nan)), float(data.get("t_end", math.nan))
        item = (int(data.get("stream", 0)), task, int(data.get("kernel", -1)),
                data.get("executed"), ts, te, task in self.rt_tasks)
        self.recent.append(item)
        if self.t_preempt is None:
            while self.recent and self.recent[0][5] < te - 2 * self.half:
                self.recent.popleft()
        elif ts > self.t_preempt + self.half:
            self.done = True

    def result(self) -> Timeline | None:
        if self.t_preempt is None:
            return None
        lo, hi = self.t_preempt - self.half, self.t_preempt + self.half
        ks = [k for k in self.recent if k[5] >= lo and k[4] <= hi]
        ks = [k[:6] + (k[1] in self.rt_tasks,) for k in ks]
        return Timeline(t_preempt=self.t_preempt, window=(lo, hi), kernels=ks,
                        policy=self.policy)


def _is_rt_event(data: dict[str, Any]) -> bool:
    p = data.get("priority")
    if p is not None:
        try:
            return int(p) == 0
        except (TypeError, ValueError):
            return str(p).upper().endswith("RT")
    return bool(data.get("rt", False))


def _event_time(data: dict[str, Any]) -> float | None:
    for key in ("t", "time", "now", "at"):
        if data.get(key) is not None:
            return float(data[key])
    return None


class Bench:
    """One workload on one device: model resolution, standalone reference, policy runs."""

    def __init__(self, workload: Workload, cfg: BenchConfig) -> None:
        if cfg.device not in DEVICE_NAMES:
            raise ValueError(f"unknown device {cfg.device!r}; use {', '.join(DEVICE_NAMES)}")
        if cfg.duration <= 0:
            raise ValueError("duration must be > 0")
        if cfg.sim_models not in ("reef", "zoo"):
            raise ValueError(f"sim_models must be 'reef' or 'zoo', got {cfg.sim_models!r}")
        self.wl = workload
        self.cfg = cfg
        self.measured = self._measured_profiles()
        self.sources: dict[str, ModelSource] = {m: self._resolve(m) for m in workload.models}
        self._inputs: dict[str, dict[str, np.ndarray]] = {}
        self.standalone_ref: dict[str, dict[str, float]] = {}
        self._now: Callable[[], float] = time.monotonic

    # -- models ----------------------------------------------------------------------------
    def _measured_profiles(self) -> dict[str, Any]:
        """The measured profiles of ``cfg.profiles`` (sim only), checked against
        ``cfg.gpu``: a profile measured on another GPU than the one simulated is refused."""
        cfg = self.cfg
        if not cfg.profiles:
            return {}
        if cfg.device != "sim":
            raise ValueError("profiles (--profiles DIR) apply to the sim device only")
        from av_infer import profiles

        found = profiles.load_profile_dir(cfg.profiles)
        profiles.check_profiles_gpu(found, cfg.gpu, cfg.profiles)
        return found

    def _resolve(self, model: str) -> ModelSource:
        cfg = self.cfg
        if cfg.device == "sim":
            from av_infer import profiles

            meas = self.measured.get(model)
            if meas is not None:
                from av_infer.model import zoo

                variant = meas.variant or cfg.scale or "full"
                plan = _cached_plan(str(zoo.path(model, variant=variant)), model)
                if len(meas.kernels) != len(plan.kernels):
                    raise ValueError(
                        f"measured profile of {model!r} ({cfg.profiles}) has "
                        f"{len(meas.kernels)} kernels, the zoo:{model}/{variant} plan has "
                        f"{len(plan.kernels)}: measured with another compiler build")
                gname = (meas.gpu or {}).get("name") or meas.device
                src = meas.source or "measured"
                return ModelSource(
                    model, f"zoo:{model}/{variant} compiled, profile {src} on {gname}",
                    plan=plan, profile=meas, kernels=len(plan.kernels), profile_source=src)
            trace = REEF_TRACES.get(model)
            if cfg.sim_models == "reef" and trace and trace in profiles.reef_models():
                plan, prof = profiles.load_reef_trace(trace, gpu=cfg.gpu)
                plan.name = model
                prof.model = model
                return ModelSource(model, f"reef-trace:{trace} (measured on AMD MI50)",
                                   plan=plan, profile=prof, kernels=len(plan.kernels),
                                   profile_source="reef-trace")
            from av_infer.model import zoo

            variant = cfg.scale or "full"
            plan = _cached_plan(str(zoo.path(model, variant=variant)), model)
            prof = profiles.derive_profile(plan, cfg.gpu)
            why = "no REEF trace" if cfg.sim_models == "reef" else "zoo plans asked for"
            factor = (cfg.profile_scale or {}).get(model)
            if factor is not None:
                if not (factor > 0 and math.isfinite(factor)):
                    raise ValueError(f"profile scale of {model!r} must be > 0, got {factor}")
                for kp in prof.kernels:
                    kp.duration_us *= factor
                prof.source = "derived-scaled"
                return ModelSource(
                    model, f"zoo:{model}/{variant} compiled, profile derived for {cfg.gpu} "
                    f"x {factor:.4g} (scaled to a measured standalone latency)", plan=plan,
                    profile=prof, kernels=len(plan.kernels), profile_source="derived-scaled")
            return ModelSource(
                model, f"zoo:{model}/{variant} compiled, profile derived for {cfg.gpu} "
                f"({why})", plan=plan, profile=prof, kernels=len(plan.kernels),
                profile_source="derived")
        from av_infer.model import zoo

        p = zoo.path(model, variant=cfg.variant)
        return ModelSource(model, f"zoo:{model}/{cfg.variant}", path=str(p))

    def _runtime(self, policy: str, c: int) -> tuple[Any, Any]:
        """A fresh (runtime, simulator-or-None) with every model of the workload loaded."""
        from av_infer.runtime import Runtime

        sim = None
        if self.cfg.device == "sim":
            from av_infer.devices.sim import SimDevice

            profs = {m: s.profile for m, s in self.sources.items()}
            sim = SimDevice(gpu=self.cfg.gpu, profiles=profs, seed=self.cfg.seed,
                            contention=self.cfg.contention, host=self.cfg.host,
                            pad=self.cfg.pad, dkp_placement=self.cfg.dkp_placement,
                            record_residency=True)
            rt = Runtime(device=sim, policy=policy, c=c, preempt_drain=self.cfg.preempt_drain,
                         be_min_share=self.cfg.be_min_share)
        else:
            rt = Runtime(device=self.cfg.device, policy=policy, c=c,
                         preempt_drain=self.cfg.preempt_drain,
                         be_min_share=self.cfg.be_min_share)
        for m, s in self.sources.items():
            info = rt.load_model(m, s.plan if s.plan is not None else s.path,
                                 precision=self.cfg.precision)
            plan = getattr(info, "plan", None)
            if plan is not None:
                s.kernels = len(plan.kernels)
        if sim is None and hasattr(rt.device, "prepare_padding"):
            from av_infer.sched.policies import get_policy

            if get_policy(policy).padding:
                self._prepare_padding(rt)
        return rt, sim

    def _prepare_padding(self, rt: Any) -> None:
        """A padding policy on a device that compiles padded dispatcher modules (cuda): the
        module over every resident plan, compiled (or read from the disk compile cache)
        before the warm-up, so the window measures padded launches from its first request
        and closing the runtime waits for no compile.

        Why: left to the launch path, a module is compiled on a background thread for each
        new set of plans a padded launch asks for, and launches run unpadded until it is
        ready. On the 2026-11-27 H200 run (DISB C, five full-size models) reef_dkp padded
        2.5 % of its BE launches (A's: 34 %) and its run took 110 s for a 2 s window: the
        runtime's close waited for the modules (the five models' module takes 110 s to
        compile there, docs/gpu_results/2026-11-27-h200/). One module over all plans
        serves every subset (``cuda_padcache``). The plans are in the zoo's DISB order
        (``gpu_bench.DISB_ZOO``, what ``scripts/gpu_pad_select_check.py`` compiles), so
        workloads of the same models share one module source: one compile per model set
        per machine (``~/.cache/av_infer/cuda``). Prints the time it took to stderr."""
        from av_infer.bench.gpu_bench import DISB_ZOO

        order = {m: i for i, m in enumerate(DISB_ZOO)}
        names = sorted(self.sources, key=lambda m: (order.get(m, len(order)), m))
        t0 = time.perf_counter()
        rt.device.prepare_padding([rt._cache.handle(m) for m in names])
        print(f"[{self.cfg.device}] padded dispatcher module of {', '.join(names)} ready "
              f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    def _input(self, rt: Any, model: str) -> dict[str, np.ndarray]:
        if model not in self._inputs:
            if self.cfg.device != "sim":
                from av_infer.model import zoo

                self._inputs[model] = zoo.sample_inputs(model, self.cfg.variant,
                                                        seed=self.cfg.seed)
            else:
                spec = rt.input_spec(model)
                self._inputs[model] = {n: np.zeros(shape, dtype=dt)
                                       for n, (shape, dt) in spec.items()}
        return self._inputs[model]

    # -- standalone ----------------------------------------------------------------------
    def standalone(self) -> dict[str, dict[str, float]]:
        """Each model alone under rt_only: warm-up, then ``standalone_n`` requests."""
        if self.standalone_ref:
            return self.standalone_ref
        from av_infer.sched.request import Priority

        models = self.wl.models  # BE models too: their alone-latency bounds BE throughput
        rt, sim = self._runtime("rt_only", self.cfg.c)
        try:
            for m in models:
                lats: list[float] = []
                dev_t: list[float] = []
                n_total = self.cfg.warmup + self.cfg.standalone_n
                done = threading.Event()
                inputs = self._input(rt, m)

                def submit_next(m: str = m, lats: list[float] = lats,
                                inputs: dict = inputs, done: threading.Event = done,
                                n_total: int = n_total, dev_t: list[float] = dev_t) -> None:
                    now = rt.now()
                    fut = rt.submit(m, inputs, priority=Priority.RT, client=f"standalone_{m}",
                                    arrival=now)

                    def cb(f: Future, lats: list[float] = lats) -> None:
                        exc = f.exception()
                        if exc is not None:
                            done.set()
                            return
                        tm = f.result().timings
                        lats.append(tm.latency)
                        dev_t.append(tm.end - tm.first_kernel_start)
                        if len(lats) >= n_total:
                            done.set()
                        else:
                            submit_next()

                    fut.add_done_callback(cb)

                if sim is not None:
                    sim.call_at(rt.now(), submit_next)
                    sim.run()
                else:
                    submit_next()
                    done.wait(timeout=600)
                meas = lats[self.cfg.warmup:]
                if not meas:
                    raise RuntimeError(f"standalone run of {m} produced no results")
                self.standalone_ref[m] = standalone_stats(meas, dev_t[self.cfg.warmup:])
        finally:
            rt.close(drain=False)
        return self.standalone_ref

    # -- one policy ----------------------------------------------------------------------
    def run_policy(self, policy: str, c: int | None = None,
                   rt_forecast: bool | None = None) -> PolicyRun:
        """The workload's mix under ``policy`` for ``duration`` seconds (``rt_forecast``:
        override ``cfg.rt_forecast``; it only applies to policies that preempt)."""
        from av_infer.sched.policies import get_policy
        from av_infer.sched.request import Priority
        from av_infer.sched.rt_forecast import BUDGET, QuietWindows, RtForecast
        from av_infer.sched.scheduler import EVENT_KINDS

        cfg = self.cfg
        c = cfg.c if c is None else c
        forecast = (cfg.rt_forecast if rt_forecast is None else rt_forecast) and \
            get_policy(policy).preempt != "none"
        ref = self.standalone()
        offsets = self.wl.periodic_offsets({m: v["p50_s"] for m, v in ref.items()})
        tasks = [t for t in self.wl.tasks if t.rt or policy != "rt_only"]
        wall0 = time.perf_counter()
        rt, sim = self._runtime(policy, c)
        records: list[Record] = []
        lock = threading.Lock()
        counts: dict[str, int] = {}
        pending = [0]
        all_done = threading.Event()
        be_streams: set[int] = set()
        be_kernels: tuple[list[float], list[float]] = ([], [])
        try:
            def listener(event: str, data: dict[str, Any]) -> None:
                if event == "preempt" and data.get("kind") == "edf":
                    event = "rt_switch"  # EDF switch between RT tasks, not a BE preemption
                elif event == "dispatch" and data.get("priority") == "BE":
                    be_streams.add(int(data["stream"]))
                elif event == "kernel" and sim is None and data.get("stream") in be_streams:
                    t_stop = data.get("t_stop", math.nan)  # a killed cpu segment's stop
                    be_kernels[0].append(float(data["t_start"]))
                    be_kernels[1].append(float(data["t_end"] if math.isnan(t_stop) else t_stop))
                counts[event] = counts.get(event, 0) + 1

            if sim is not None:
                # the simulator counts the launches it completes, one "kernel" event each
                # (one completion record a launch; nothing ran on this fresh device yet):
                # the listener is not called once per kernel for a count (issue 31)
                listener.event_kinds = EVENT_KINDS - {"kernel"}  # type: ignore[attr-defined]
                sim_kernels0 = sim.stats["kernels"]
            rt.add_listener(listener)
            if forecast:
                rt.add_listener(QuietWindows(rt.device, RtForecast(
                    budget=BUDGET if cfg.forecast_budget is None else cfg.forecast_budget)))
            deadlines: dict[str, float | None] = {}
            for t in tasks:
                dl = None
                if t.rt:
                    dl = cfg.deadline_ms / 1e3 if cfg.deadline_ms else t.period_s
                deadlines[t.id] = dl
                try:
                    rt.configure_client(t.id, Priority.RT if t.rt else Priority.BE,
                                        relative_deadline=dl)
                except (AttributeError, TypeError):
                    pass
            self._warmup(rt, sim, tasks)
            t0 = rt.now() + (0.001 if sim is not None else 0.05)
            t_end = t0 + cfg.duration
            capture = None
            if cfg.timeline and policy != "rt_only":
                capture = TimelineCapture(after=t0 + 0.1 * cfg.duration,
                                          half_window=_timeline_half(ref), policy=policy)
                rt.add_listener(capture)

            def submit(task: BenchTask, arrival: float) -> None:
                dl = deadlines[task.id]
                rec = Record(client=task.id, model=task.model, rt=task.rt, arrival=arrival,
                             deadline=arrival + dl if dl else math.inf,
                             kernels=self.sources[task.model].kernels)
                with lock:
                    records.append(rec)
                    pending[0] += 1
                try:
                    fut = rt.submit(task.model, self._input(rt, task.model),
                                    priority=Priority.RT if task.rt else Priority.BE,
                                    deadline=rec.deadline if dl else None, client=task.id,
                                    arrival=arrival)
                except Exception as e:  # rejected at submit: recorded, never raised
                    rec.error = f"{type(e).__name__}: {e}"
                    _finish()
                    return

                def cb(f: Future, rec: Record = rec, task: BenchTask = task) -> None:
                    exc = f.exception()
                    if exc is not None:
                        rec.error = f"{type(exc).__name__}: {exc}"
                    else:
                        tm = f.result().timings
                        rec.start, rec.first_kernel_start = tm.start, tm.first_kernel_start
                        rec.end = tm.end
                        rec.preempted = tm.preempted
                        rec.kernels_padded = tm.kernels_padded
                    if not task.open_loop and rt.now() < t_end and exc is None:
                        submit(task, rt.now())
                    _finish()

                fut.add_done_callback(cb)

            def _finish() -> None:
                with lock:
                    pending[0] -= 1
                    if pending[0] == 0 and closed_loops_over[0]:
                        all_done.set()

            closed_loops_over = [False]
            schedule = sorted(
                (t0 + a, i, task) for i, task in enumerate(tasks)
                for a in task.arrivals(cfg.duration, seed=cfg.seed,
                                       offset=offsets.get(task.id, 0.0))
            )
            closed = [t for t in tasks if not t.open_loop]
            if sim is not None:
                self._drive_sim(sim, rt, schedule, closed, submit, t0, t_end, closed_loops_over)
            else:
                self._drive_wall(rt, schedule, closed, submit, t0, t_end, closed_loops_over,
                                 pending, lock, all_done)
            if sim is not None and sim.stats["kernels"] > sim_kernels0:
                counts["kernel"] = sim.stats["kernels"] - sim_kernels0
            events = dict(counts)
            tl = capture.result() if capture is not None else None
            residency = self._residency(sim, be_streams, be_kernels)
            device = rt.device.telemetry() if sim is not None else {}
        finally:
            rt.close(drain=False)
        return PolicyRun(policy=policy, c=c, records=records, t0=t0, duration=cfg.duration,
                         preemptions=events.get("preempt", 0), events=events, timeline=tl,
                         wall_s=time.perf_counter() - wall0, residency=residency,
                         device=device, label=policy + ("+forecast" if forecast else ""),
                         rt_forecast=forecast)

    def _residency(self, sim: Any, be_streams: set[int],
                   be_kernels: tuple[list[float], list[float]]) -> Residency:
        """BE work on the device: the simulator's block batches of the BE streams, else
        the BE kernels the runtime reported (segments on cpu, kernels on cuda)."""
        if sim is not None:
            starts: list[float] = []
            ends: list[float] = []
            for s in sorted(be_streams):
                st, en = sim.residency(s)
                starts += st
                ends += en
            return Residency.of(starts, ends, "block batch")
        grain = "segment" if self.cfg.device == "cpu" else "kernel"
        return Residency.of(be_kernels[0], be_kernels[1], grain)

    def _warmup(self, rt: Any, sim: Any, tasks: list[BenchTask]) -> None:
        """A few requests per model so first-use costs stay out of the window."""
        from av_infer.sched.request import Priority

        futs = []
        for m in dict.fromkeys(t.model for t in tasks):
            prio = Priority.RT if any(t.rt and t.model == m for t in tasks) else Priority.BE
            for _ in range(1 if self.cfg.device == "sim" else max(1, self.cfg.warmup)):
                futs.append(rt.submit(m, self._input(rt, m), priority=prio,
                                      client=f"warmup_{m}", arrival=rt.now()))
        if sim is not None:
            sim.run()
        for f in futs:
            f.exception(timeout=600)

    def _drive_sim(self, sim: Any, rt: Any, schedule: list, closed: list[BenchTask],
                   submit: Callable[[BenchTask, float], None], t0: float, t_end: float,
                   closed_over: list[bool]) -> None:
        for t_arr, _i, task in schedule:
            sim.call_at(t_arr, lambda task=task, t_arr=t_arr: submit(task, t_arr))
        for task in closed:
            sim.call_at(t0, lambda task=task: submit(task, t0))
        steps = 50
        with _bar(self.cfg.progress, self.cfg.duration, "virtual s") as bar:
            for k in range(1, steps + 1):
                sim.run(until=t0 + self.cfg.duration * k / steps)
                bar.update(self.cfg.duration / steps)
        closed_over[0] = True
        sim.run()  # drain: RT that arrived in the window, BE still running

    def _drive_wall(self, rt: Any, schedule: list, closed: list[BenchTask],
                    submit: Callable[[BenchTask, float], None], t0: float, t_end: float,
                    closed_over: list[bool], pending: list[int], lock: threading.Lock,
                    all_done: threading.Event) -> None:
        def feeder() -> None:
            while rt.now() < t0:
                time.sleep(max(0.0, t0 - rt.now()))
            for task in closed:
                submit(task, rt.now())
            for t_arr, _i, task in schedule:
                delay = t_arr - rt.now()
                if delay > 0:
                    time.sleep(delay)
                submit(task, t_arr)

        th = threading.Thread(target=feeder, name="bench-arrivals", daemon=True)
        th.start()
        with _bar(self.cfg.progress, self.cfg.duration, "s") as bar:
            shown = 0.0
            while rt.now() < t_end:
                time.sleep(min(0.2, max(0.0, t_end - rt.now())))
                el = min(self.cfg.duration, rt.now() - t0)
                if el > shown:
                    bar.update(el - shown)
                    shown = el
        th.join(timeout=60)
        with lock:
            closed_over[0] = True
            if pending[0] == 0:
                all_done.set()
        all_done.wait(timeout=max(60.0, 10 * self.cfg.duration))


def _timeline_half(ref: dict[str, dict[str, float]]) -> float:
    """Half width of the timeline window: 1/20 of the shortest standalone latency."""
    vals = [v["p50_s"] for v in ref.values()] or [0.01]
    return max(100e-6, min(vals) / 20)


_PLANS: dict[tuple[str, str], Any] = {}


def _cached_plan(path: str, name: str) -> Any:
    from av_infer.model.compiler import compile_model

    key = (path, name)
    if key not in _PLANS:
        _PLANS[key] = compile_model(path, name=name)
    return _PLANS[key]


class _NullBar:
    def __enter__(self) -> _NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: float) -> None:
        return None


def _bar(enabled: bool, total: float, unit: str) -> Any:
    if not enabled:
        return _NullBar()
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, leave=False,
                bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} {unit} [{elapsed}<{remaining}]")
