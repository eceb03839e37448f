"""``av-infer bench --peer torch``: av_infer on the GPU beside what an AV engineer writes in
an afternoon with PyTorch (issue 30 item 6).

One load, the same client code as ``--peer ort`` (``bench.peer._drive``): one periodic RT
client (``rt_rate`` Hz; latency = completion seen by the client minus the *scheduled*
arrival) and closed-loop BE clients (one per BE model unless ``be_clients`` says more,
spread round-robin over the BE models). Systems, each opened, measured and closed in turn
(so only one holds GPU memory at a time):

* ``avi``: ``Runtime(CudaDevice(vendor=...))`` with ``policy`` (default reef); RT model
  pinned; every model at ``precision``; adds ``preemption_us`` {p50, p99, n}: RT arrival to
  the last BE kernel stopped (the scheduler's ``preemption_stop_ms``);
* ``torch_prio``: one ``torch.cuda.Stream`` per client, the RT stream at the highest
  priority, BE streams at the lowest, each client replaying its own CUDA graph (captured
  once at open); ``torch_prio_eager``: the same in eager mode;
* ``torch_rt_alone`` / ``torch_rt_alone_eager``: the RT model alone (the floor).

Precision: fp32 = FP32 with TF32 off (cuDNN / cuBLAS FMA maths); tf32 = TF32 allowed;
fp16 = ``model.half()`` in channels_last with FP16 inputs (the closest runnable stand-in
for TensorRT FP16 here). Torch twins are the zoo architectures from torchvision /
transformers at full size with random weights (``gpu_bench._torch_model``): latency only.

Without torch, CUDA or a usable cuda device it raises :class:`PeerUnavailable` with the
reason before anything is loaded (the CLI prints it and exits 2). Torch is imported lazily:
it is not in the project's venv (the GPU image has it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["WORKLOADS", "PeerUnavailable", "TorchPeerConfig", "format_torch_peer",
           "run_torch_peer"]

#: DISB A and C's models and RT rates (shared/disb/workloads/{A,C}.json): RT vgg19 at
#: 100 Hz; BE resnet152 (A) or resnet152, densenet201, vgg19, inception_v3, distilbert (C)
WORKLOADS: dict[str, tuple[str, tuple[str, ...], float]] = {
    "A": ("vgg19", ("resnet152",), 100.0),
    "C": ("vgg19", ("resnet152", "densenet201", "vgg19", "inception_v3", "distilbert"), 100.0),
}
SYSTEMS = ("torch_rt_alone", "torch_rt_alone_eager", "torch_prio", "torch_prio_eager", "avi")


class PeerUnavailable(RuntimeError):
    """The comparison cannot run here (no torch, no CUDA GPU, no cuda device); why."""


@dataclass
class TorchPeerConfig:
    workload: str = "A"
    rt_model: str = "vgg19"
    be_models: tuple[str, ...] = ("resnet152",)
    rt_rate: float = 100.0
    be_clients: int = 0  # 0: one per BE model
    precision: str = "fp32"
    policy: str = "reef"
    c: int = 4
    duration: float = 4.0
    warmup: float = 1.0
    scale: str = "full"
    vendor: str = "auto"
    systems: tuple[str, ...] = SYSTEMS
    progress: bool = True
    device_id: int = 0
    #: the avi system on the CPU emulator (tests: proves the wiring, measures nothing)
    emulate: bool = False
    #: av_infer's RT model as one CUDA graph launch per request (``CudaDevice(rt_graphs=N)``,
    #: docs/cuda_graphs.md): graph instances per model, 0 = the plain per-op path; the
    #: device's ``rt_graphs`` telemetry (instances taken, pool exhausted, refusals) goes
    #: into the avi system's report, so a run says whether the graphs actually ran
    rt_graphs: int = 0

    @classmethod
    def for_workload(cls, workload: str, rate_scale: float = 1.0, **kw: Any) -> TorchPeerConfig:
        rt, be, rate = WORKLOADS[workload]
        return cls(workload=workload, rt_model=rt, be_models=be, rt_rate=rate * rate_scale, **kw)

    def clients(self) -> list[str]:
        n = self.be_clients or len(self.be_models)
        return [self.be_models[i % len(self.be_models)] for i in range(n)]


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise PeerUnavailable(f"torch is not installed ({e}); --peer torch runs on the GPU "
                              "image, whose python3 has torch") from e
    if not torch.cuda.is_available():
        raise PeerUnavailable("torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    return torch


def check_available(cfg: TorchPeerConfig) -> None:
    """Raise PeerUnavailable unless every system of ``cfg`` can run here."""
    from av_infer.devices.cuda_vendor import PRECISIONS

    if cfg.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {cfg.precision!r}")
    if any(s.startswith("torch") for s in cfg.systems):
        _torch()
    if "avi" in cfg.systems:
        from av_infer.devices.cuda import availability

        ok, why = availability(cfg.device_id, emulate=cfg.emulate)
        if not ok:
            raise PeerUnavailable(f"av_infer's cuda device is unavailable: {why}")


# -- torch ----------------------------------------------------------------------------------
def _torch_client(torch: Any, name: str, precision: str, stream: Any, graphs: bool,
                  models: dict[str, Any], notes: dict[str, Any]) -> Callable[[], None]:
    """One client's call: its model on its own stream, eager or its own CUDA graph (a
    model whose capture fails runs eager, listed in ``notes["eager_fallback"]``)."""
    from av_infer.bench.gpu_bench import _torch_model

    if name not in models:
        got = _torch_model(name)
        if got is None:
            raise PeerUnavailable(f"no torch twin of {name!r}")
        m, make = got
        m = m.cuda().eval()
        if precision == "fp16":
            m = m.half().to(memory_format=torch.channels_last)
        models[name] = (m, make)
    m, make = models[name]
    x = make("cuda")
    if precision == "fp16":
        x = {k: (v.half().contiguous(memory_format=torch.channels_last) if v.dim() == 4
                 else v) for k, v in x.items()}
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):  # warm-up (cuDNN autotune off: fixed algorithms, no search)
            m(**x)
    stream.synchronize()

    def eager() -> None:
        with torch.no_grad(), torch.cuda.stream(stream):
            m(**x)
        stream.synchronize()

    if not graphs:
        return eager
    g = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad(), torch.cuda.graph(g, stream=stream):
            m(**x)
        stream.synchronize()
    except Exception as e:  # noqa: BLE001 - host-side control flow: not capturable
        notes.setdefault("eager_fallback", []).append(f"{name}: {e}"[:200])
        return eager

    def replay() -> None:
        with torch.cuda.stream(stream):
            g.replay()
        stream.synchronize()
    return replay


def _open_torch(cfg: TorchPeerConfig, with_be: bool, graphs: bool, notes: dict[str, Any]
                ) -> tuple[Callable[[float], None], list[Callable[[], None]], Callable[[], None]]:
    torch = _torch()
    torch.backends.cudnn.benchmark = False
    tf32 = cfg.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    models: dict[str, Any] = {}
    rt_stream = torch.cuda.Stream(priority=-100)  # clamped to the greatest priority
    rt_fn = _torch_client(torch, cfg.rt_model, cfg.precision, rt_stream, graphs, models, notes)
    be_fns = []
    if with_be:
        for name in cfg.clients():
            be_fns.append(_torch_client(torch, name, cfg.precision,
                                        torch.cuda.Stream(priority=0), graphs, models, notes))

    def close() -> None:
        models.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    return (lambda _sched: rt_fn()), be_fns, close


# -- av_infer -----------------------------------------------------------------------------
def _open_avi(cfg: TorchPeerConfig, out: dict[str, Any]
              ) -> tuple[Callable[[float], None], list[Callable[[], None]], Callable[[], None]]:
    from av_infer import Runtime
    from av_infer.devices.cuda import CudaDevice
    from av_infer.model import zoo

    clients = cfg.clients()
    dev = CudaDevice(device_id=cfg.device_id, c=cfg.c, vendor=cfg.vendor, emulate=cfg.emulate,
                     rt_graphs=cfg.rt_graphs)
    r = Runtime(dev, policy=cfg.policy, c=cfg.c, max_be_streams=len(clients))
    try:
        r.load_model("rt", str(zoo.path(cfg.rt_model, cfg.scale)), pin=True,
                     precision=cfg.precision)
        x_rt = zoo.sample_inputs(cfg.rt_model, cfg.scale)
        xs = {}
        for name in sorted(set(clients)):
            r.load_model(f"be_{name}", str(zoo.path(name, cfg.scale)), precision=cfg.precision)
            xs[name] = zoo.sample_inputs(name, cfg.scale)
        r.configure_client("rt", "RT", relative_deadline=1.0 / cfg.rt_rate)
        for _ in range(5):
            r.submit("rt", x_rt, priority="RT", client="warm").result(timeout=300)
        for name in xs:
            r.submit(f"be_{name}", xs[name], client="warm").result(timeout=300)
    except BaseException:
        r.close()
        raise
    out["vendor"] = dev.telemetry().get("vendor")

    def rt_infer(sched: float) -> None:
        r.infer("rt", x_rt, client="rt", arrival=sched)

    be_fns = [lambda i=i, m=m: r.infer(f"be_{m}", xs[m], client=f"be{i}")
              for i, m in enumerate(clients)]

    def close() -> None:
        st = r.stats()
        d = st.get("preemption_stop_ms", {}) or {}
        out["preemption_us"] = {"p50": _us(d.get("p50")), "p99": _us(d.get("p99")),
                                "n": d.get("count")}
        out["preemptions"] = st.get("preemptions")
        out["rt_graphs"] = dev.telemetry().get("rt_graphs")
        r.close()

    return rt_infer, be_fns, close


def _us(ms: Any) -> float | None:
    return None if ms is None else float(ms) * 1e3


# -- the run --------------------------------------------------------------------------------
def run_torch_peer(cfg: TorchPeerConfig) -> dict[str, Any]:
    """Run every system of ``cfg.systems`` on the same load; the report dict (module
    docstring). Raises PeerUnavailable first where it cannot run."""
    from av_infer.bench.peer import _drive, _summary, machine_info

    check_available(cfg)
    doc: dict[str, Any] = {
        "kind": "peer", "peer": "torch", "workload": cfg.workload,
        "precision": cfg.precision, "config": asdict(cfg),
        "machine": machine_info(),
    }
    try:
        import torch

        doc["torch"] = {"version": torch.__version__,
                        "gpu": torch.cuda.get_device_name(cfg.device_id),
                        "cudnn": torch.backends.cudnn.version()}
    except Exception:  # noqa: BLE001 - avi alone runs without torch
        pass
    for name in cfg.systems:
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        try:
            if name == "avi":
                rt_fn, be_fns, close = _open_avi(cfg, extra)
            else:
                graphs = not name.endswith("_eager")
                rt_fn, be_fns, close = _open_torch(cfg, name.startswith("torch_prio"), graphs,
                                                   extra)
            try:
                raw = _drive(rt_fn, be_fns, cfg, name)  # type: ignore[arg-type]
            finally:
                close()
            out = _summary(raw)
            out.update(extra)
            out["open_run_s"] = round(time.perf_counter() - t0, 2)
        except PeerUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - one system failing leaves the others' rows
            out = {"error": f"{type(e).__name__}: {e}"[:400]}
        doc[name] = out
    doc["ratios"] = _ratios(doc)
    return doc


def _ratio(a: Any, b: Any) -> float | None:
    return None if a is None or not b else float(a) / float(b)


def _ratios(doc: dict[str, Any]) -> dict[str, Any]:
    a = doc.get("avi") or {}
    out: dict[str, Any] = {}
    for other in ("torch_prio", "torch_prio_eager", "torch_rt_alone"):
        o = doc.get(other) or {}
        if "rt_p99_ms" in a and "rt_p99_ms" in o:
            out[f"avi/{other}"] = {"rt_p99": _ratio(a["rt_p99_ms"], o["rt_p99_ms"]),
                                   "rt_p50": _ratio(a["rt_p50_ms"], o["rt_p50_ms"]),
                                   "be_rps": _ratio(a.get("be_rps"), o.get("be_rps"))}
    return out


def summary_row(doc: dict[str, Any]) -> dict[str, Any]:
    """The ``peer`` row of gpu_summary.json (issue 30 item 7) from one run's report."""
    def pick(d: Any) -> dict[str, Any]:
        d = d or {}
        return {k: d.get(k) for k in ("rt_p50_ms", "rt_p99_ms", "be_rps")}

    return {"workload": doc.get("workload"), "precision": doc.get("precision"),
            "avi": pick(doc.get("avi")), "torch_prio": pick(doc.get("torch_prio")),
            "torch_rt_alone": pick(doc.get("torch_rt_alone"))}


def format_torch_peer(doc: dict[str, Any]) -> str:
    from av_infer.bench.peer import fmt_num

    cfg = doc["config"]
    be = list(cfg["be_models"])
    n = cfg["be_clients"] or len(be)
    clients = [be[i % len(be)] for i in range(n)]
    lines = [f"peer torch: workload {doc['workload']}, RT {cfg['rt_model']} @ "
             f"{cfg['rt_rate']:g} Hz, BE clients {', '.join(clients)}, "
             f"{doc['precision']}, {cfg['duration']:g} s each, policy {cfg['policy']} "
             f"(vendor {cfg['vendor']}"
             + (f", RT as one graph: {cfg['rt_graphs']} instances" if cfg.get("rt_graphs")
                else "") + ")",
             f"{'system':<22}{'RT p50 ms':>10}{'p99':>8}{'p99.9':>8}{'RT n':>7}{'BE req/s':>10}"
             f"{'preempt p50/p99 us':>20}"]
    for s in SYSTEMS[::-1]:
        r = doc.get(s)
        if not r:
            continue
        if "error" in r:
            lines.append(f"{s:<22}error: {r['error']}")
            continue
        pre = r.get("preemption_us") or {}
        ptxt = f"{fmt_num(pre.get('p50'), 0)}/{fmt_num(pre.get('p99'), 0)}" if pre else ""
        lines.append(f"{s:<22}{fmt_num(r.get('rt_p50_ms')):>10}{fmt_num(r.get('rt_p99_ms')):>8}"
                     f"{fmt_num(r.get('rt_p999_ms')):>8}{r.get('rt_n', 0):>7}"
                     f"{r.get('be_rps', 0.0):>10.1f}"
                     f"{ptxt:>20}")
    for k, v in (doc.get("ratios") or {}).items():
        lines.append(f"{k}: RT p99 {fmt_num(v['rt_p99'])}x, RT p50 {fmt_num(v['rt_p50'])}x, "
                     f"BE req/s {fmt_num(v['be_rps'])}x")
    return "\n".join(lines)
