"""The simulator's host model (devices/sim_host.py): start work, one FIFO host, files.

Virtual-time assertions: the simulator is deterministic, its clock is not the wall's."""

from __future__ import annotations

import json

import pytest

from av_infer.bench.host_fit import _l1_line
from av_infer.devices import sim_host
from av_infer.devices.sim import SimDevice
from av_infer.devices.sim_host import HostModel
from av_infer.profiles import GPUS
from tests.devices.test_sim_device import Harness

US = 1e-6
LAUNCH = GPUS["mi50"].launch_us * US


def _one_model_run(host: object, n_tasks: int = 3) -> list[tuple]:
    h = Harness({"m": (6, 40.0, 60, 1)}, host=host)
    s = h.dev.open_stream(0)
    for i in range(n_tasks):
        h.dev.call_at(i * 100 * US, lambda: h.dev.enqueue(s, h.task("m"), 0, 5))
    h.dev.run()
    return [(c.task, c.kernel, c.t_start, c.t_end) for c in h.done]


def test_off_by_default_and_zero_costs_change_nothing() -> None:
    base = _one_model_run(None)
    assert _one_model_run("none") == base
    assert _one_model_run(HostModel(0.0, 0.0, 0.0)) == base  # rule on, no cost


def test_request_alone_starts_after_its_start_work() -> None:
    h = Harness({"m": (10, 50.0, 60, 1)}, host=HostModel(start_us=300, per_kernel_us=5))
    s = h.dev.open_stream(0)
    h.dev.enqueue(s, h.task("m"), 0, 9)
    h.dev.run()
    start = (300 + 5 * 10) * US
    assert h.done[0].t_start == pytest.approx(start + LAUNCH)
    # the kernels themselves are not slowed: the request is the start work longer
    assert h.done[-1].t_end - h.done[0].t_start == pytest.approx(500 * US)


def test_one_fifo_host_serialises_start_work_across_streams() -> None:
    h = Harness({"a": (2, 50.0, 30, 1), "b": (2, 50.0, 30, 1)},
                host=HostModel(start_us=200))
    s1, s2 = h.dev.open_stream(0), h.dev.open_stream(1)
    ta, tb = h.task("a"), h.task("b")  # both started at t = 0
    h.dev.enqueue(s1, ta, 0, 1)
    h.dev.enqueue(s2, tb, 0, 1)
    h.dev.run()
    assert h.of(ta)[0].t_start == pytest.approx(200 * US + LAUNCH)
    assert h.of(tb)[0].t_start == pytest.approx(400 * US + LAUNCH)  # waited for a's


def test_completions_keep_the_host_busy() -> None:
    h = Harness({"m": (1, 50.0, 60, 1)}, host=HostModel(start_us=100, complete_us=30))
    s = h.dev.open_stream(0)
    t1 = h.task("m")
    h.dev.enqueue(s, t1, 0, 0)
    end1 = 100 * US + LAUNCH + 50 * US
    box: list[int] = []

    def second() -> None:  # started 1 us after the first completed
        box.append(h.task("m"))
        h.dev.enqueue(s, box[0], 0, 0)

    h.dev.call_at(end1 + 1 * US, second)
    h.dev.run()
    assert h.of(t1)[0].t_end == pytest.approx(end1)
    # the completion's 30 us (from end1) came first on the host, then the second's 100 us
    assert h.of(box[0])[0].t_start == pytest.approx(end1 + 130 * US + LAUNCH)


def test_a_stream_keeps_transmit_order_under_host_delays() -> None:
    h = Harness({"big": (3, 20.0, 60, 1), "small": (3, 20.0, 60, 1)},
                host=HostModel(start_us=50, per_kernel_us=100))
    s = h.dev.open_stream(0)
    t1, t2 = h.task("big"), h.task("small")
    h.dev.enqueue(s, t1, 0, 2)
    h.dev.enqueue(s, t2, 0, 2)
    h.dev.run()
    order = [(c.task, c.kernel) for c in sorted(h.done, key=lambda c: c.t_start)]
    assert order == [(t1, 0), (t1, 1), (t1, 2), (t2, 0), (t2, 1), (t2, 2)]
    assert h.of(t1)[0].t_start == pytest.approx(350 * US + LAUNCH)


def test_telemetry_says_what_host_model_ran() -> None:
    dev = SimDevice("h200", host=HostModel(1.0, 2.0, 3.0, "h200"))
    assert dev.telemetry()["host"] == {"name": "explicit", "start_us": 1.0,
                                       "per_kernel_us": 2.0, "complete_us": 3.0}
    assert "host" not in SimDevice("h200").telemetry()


def test_parameter_file_round_trip_and_refusals(tmp_path) -> None:
    p = tmp_path / "host.json"
    sim_host.save_params(p, HostModel(900.0, 7.5, 0.0, "h200"), {"from": "x"})
    m = sim_host.load_params(p)
    assert (m.start_us, m.per_kernel_us, m.complete_us, m.gpu) == (900.0, 7.5, 0.0, "h200")
    assert SimDevice("h200", host=str(p))._host == m
    with pytest.raises(ValueError, match="fitted on h200"):
        SimDevice("h100", host=str(p))
    with pytest.raises(FileNotFoundError):
        sim_host.load_params(tmp_path / "missing.json")
    bad = json.loads(p.read_text())
    bad["start_us"] = -1
    q = tmp_path / "bad.json"
    q.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="start_us"):
        sim_host.load_params(q)
    q.write_text(json.dumps({**bad, "kind": "contention"}))
    with pytest.raises(ValueError, match="not a host parameter file"):
        sim_host.load_params(q)
    with pytest.raises(ValueError, match="unknown host model"):
        SimDevice("h200", host="fast")
    with pytest.raises(ValueError, match="complete_us"):
        HostModel(0.0, 0.0, float("nan"))


def test_start_line_fit_is_exact_on_a_line_and_robust_to_one_outlier() -> None:
    pts = [(24.0, 900 + 7 * 24), (114.0, 900 + 7 * 114), (508.0, 900 + 7 * 508)]
    a, b = _l1_line(pts)
    assert (a, b) == (pytest.approx(900), pytest.approx(7))
    a, b = _l1_line(pts + [(124.0, 900 + 7 * 124), (158.0, 300.0)])
    assert (a, b) == (pytest.approx(900), pytest.approx(7))
    assert _l1_line([(10.0, -5.0), (20.0, -1.0)]) == (0.0, 0.0)  # never negative


def test_bench_cli_refuses_a_host_model_off_the_simulator_or_for_another_gpu(tmp_path) -> None:
    from av_infer.cli import main

    p = tmp_path / "host.json"
    sim_host.save_params(p, HostModel(900.0, 7.5, 0.0, "h200"), {})
    with pytest.raises(SystemExit, match="--host applies to --device sim only"):
        main(["bench", "--workload", "A", "--device", "cpu", "--host", str(p)])
    with pytest.raises(SystemExit, match="fitted on h200, the simulated GPU is h100"):
        main(["bench", "--workload", "A", "--device", "sim", "--gpu", "h100", "--host", str(p)])
