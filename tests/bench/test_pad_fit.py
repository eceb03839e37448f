"""``--refit-pad`` (bench.pad_fit, issue 33): the padded launch's per-model cost from a
pad_select measurement or fitted to reef_dkp rows. The "GPU" DISB results are simulator
runs with a known pad model written in the GPU file's format (virtual time only), so the
fit must recover the overhead that produced them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from av_infer.bench import compare_sim, pad_fit
from av_infer.bench.harness import Bench, BenchConfig
from av_infer.bench.report import build_report
from av_infer.bench.workload import load_workload
from av_infer.cli import main
from av_infer.devices import sim_pad

WORKLOAD = {"time": 10, "tasks": [
    {"id": "cam_rt", "load": {"type": "periodic", "frequency": 200},
     "client": {"model_name": "vgg19"}},
    {"id": "bg_be", "load": {"type": "continuous"}, "client": {"model_name": "resnet152"}},
]}

#: a pad_select step's log as gpu_check.sh writes it: a row per model, then the document
ROWS = [{"model": "vgg19", "kernels": 24, "plain_ms": 12.9, "parts_ms": 15.69, "regs_ms": 14.1,
         "parts_overhead_pct": 21.6, "regs_overhead_pct": 9.4, "ok": True},
        {"model": "distilbert", "kernels": 114, "plain_ms": 6.14, "parts_ms": 5.22,
         "regs_ms": 5.21, "parts_overhead_pct": -15.0, "regs_overhead_pct": -15.2, "ok": True},
        {"model": "resnet152", "ok": False, "error": "RuntimeError: cut"}]


def _log(tmp_path: Path, whole: bool) -> Path:
    lines = ["== gpu_check: pad_select (cap 210s, 3s elapsed)",
             "pad_select: padded module ready in 110.1 s"]
    lines += [f"pad_select row: {json.dumps(r)}" for r in ROWS]
    if whole:
        lines += json.dumps({"what": "REEF Fig. 18a", "gpu": "NVIDIA H200", "rows": ROWS},
                            indent=1).splitlines()
        lines.append("vgg19: plain 12.900 ms, parts +21.6 %, regs +9.4 %")
    p = tmp_path / ("gpu_check.log" if whole else "cut.log")
    p.write_text("\n".join(lines) + "\n")
    return p


def test_pad_select_log_or_json_gives_per_model_overheads(tmp_path, capsys) -> None:
    log = _log(tmp_path, whole=True)
    out = tmp_path / "pad.json"
    rc = main(["bench", "--refit-pad", str(log), "--params-out", str(out)])
    assert rc == 0 and "vgg19 +21.6 %" in capsys.readouterr().out
    model = sim_pad.load_params(out)
    assert model.gpu == "h200" and model.default is None
    assert model.overhead == {"vgg19": pytest.approx(0.216), "distilbert": pytest.approx(-0.15)}
    regs = pad_fit.refit_pad(log, compare_sim.CompareOptions(), tmp_path / "r.json",
                             select="regs")
    assert regs["overhead"]["vgg19"] == pytest.approx(0.094) and regs["select"] == "regs"
    # the script's own JSON document (--out) reads the same
    js = tmp_path / "pad_select.json"
    js.write_text(json.dumps({"gpu": "NVIDIA H200", "rows": ROWS}))
    assert pad_fit.refit_pad(js, compare_sim.CompareOptions(), tmp_path / "j.json")[
        "overhead"] == model.overhead
    # rows cut from the log before the document: the GPU must be named
    cut = _log(tmp_path, whole=False)
    with pytest.raises(ValueError, match="pass --gpu"):
        pad_fit.refit_pad(cut, compare_sim.CompareOptions(), tmp_path / "c.json")
    assert pad_fit.refit_pad(cut, compare_sim.CompareOptions(gpu="h200"),
                             tmp_path / "c.json")["gpu"] == "h200"
    with pytest.raises(ValueError, match="made on h200, not h100"):
        pad_fit.refit_pad(log, compare_sim.CompareOptions(gpu="h100"), tmp_path / "x.json")


def _gpu_doc(wl_file: Path, pad: object) -> dict:
    """A simulator run with pad model ``pad`` dressed as a GPU result."""
    cfg = BenchConfig(device="sim", duration=0.3, gpu="h100", scale="scaled",
                      sim_models="zoo", contention="beta=150", progress=False,
                      standalone_n=5, pad=pad)
    bench = Bench(load_workload(str(wl_file)), cfg)
    doc = build_report(bench, [bench.run_policy(p) for p in ("rt_only", "reef_dkp")])
    doc.update(device="cuda", gpu=None, contention=None, dkp_placement=None)
    return doc


def test_fit_on_reef_dkp_rows_recovers_the_overhead_of_a_synthetic_gpu(tmp_path) -> None:
    wl = tmp_path / "synth.json"
    wl.write_text(json.dumps(WORKLOAD))
    true = sim_pad.PadModel({"vgg19": 0.6}, None, "h100")
    f = tmp_path / "disb_cuda.json"
    f.write_text(json.dumps({"policies": {"synth": _gpu_doc(wl, true)}}))
    opts = compare_sim.CompareOptions(gpu="h100", contention="beta=150")
    # REEF's 0.8 % puts the twin's padded RT kernels too fast
    before = compare_sim.run_compare(f, opts)
    p50 = next(r for r in before["rows"] if r["policy"] == "reef_dkp"
               and r["metric"] == "rt_p50_ms")
    assert p50["rel_err"] < -0.05
    out = tmp_path / "pad_fit.json"
    doc = pad_fit.refit_pad(f, opts, out, grid=7, refine=6)
    assert doc["default"] == pytest.approx(0.6, rel=0.1), doc["evaluations"]
    assert {r["policy"] for r in doc["rows"]} == {"reef_dkp"}
    assert doc["loss_mean_sq_log"] < 1e-3 and "scale" in pad_fit.format_fit(doc)
    after = compare_sim.run_compare(f, compare_sim.CompareOptions(
        gpu="h100", contention="beta=150", pad=str(out)))
    assert after["pad"] == str(out) and after["sim"]["synth"]["pad_model"]["default"] > 0.5
    dkp = [r for r in after["rows"] if r["policy"] == "reef_dkp" and r["limit"]]
    assert dkp and all(r["within"] for r in dkp), dkp
    # a base file: the multiplier scales its per-model overheads
    base = tmp_path / "base.json"
    sim_pad.save_params(base, sim_pad.PadModel({"vgg19": 0.3}, None, "h100"), {})
    doc = pad_fit.refit_pad(f, compare_sim.CompareOptions(
        gpu="h100", contention="beta=150", pad=str(base)), tmp_path / "s.json", grid=7,
        refine=6)
    assert doc["scale"] == pytest.approx(2.0, rel=0.1) and doc["base"] == str(base)
    # per RT model: only vgg19 runs RT here, so only its multiplier is searched again
    assert pad_fit.rt_models([json.loads(f.read_text())["policies"]["synth"]]) == ["vgg19"]
    doc = pad_fit.refit_pad(f, compare_sim.CompareOptions(
        gpu="h100", contention="beta=150", pad=str(base)), tmp_path / "pm.json", grid=7,
        refine=6, per_model=True)
    assert list(doc["per_model"]["scales"]) == ["vgg19"]
    assert sim_pad.load_params(tmp_path / "pm.json").overhead["vgg19"] == pytest.approx(
        0.6, rel=0.1)
    assert "per RT model: vgg19 x" in pad_fit.format_fit(doc)
    # pad_select measurements and DISB files are not fitted together
    with pytest.raises(ValueError, match="not both"):
        pad_fit.refit_pad([f, _log(tmp_path, whole=True)], opts, tmp_path / "m.json")
