"""Issue 33: measured profiles in the simulator, the simulator twin of a GPU result
(``--compare-sim``) and the refit of the contention model (``--refit-contention``).

Virtual time only (the simulator's): every number asserted here is deterministic. The
"GPU" results are simulator reports written in the GPU file's format, so the truth is
known: the twin of a run must reproduce it exactly, and a fit must recover the ``beta``
that produced it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from av_infer import profiles
from av_infer.bench import compare_sim, contention_fit
from av_infer.bench.harness import Bench, BenchConfig
from av_infer.bench.report import build_report
from av_infer.bench.workload import load_workload
from av_infer.cli import main
from av_infer.devices import sim_contention
from av_infer.devices.sim import SimDevice

#: vgg19 (scaled) RT at 200 Hz beside resnet152 (scaled) BE on a simulated h100: small,
#: fast, and with streams sensitive to beta between ~30 and ~1000.
WORKLOAD = {"time": 10, "tasks": [
    {"id": "cam_rt", "load": {"type": "periodic", "frequency": 200},
     "client": {"model_name": "vgg19"}},
    {"id": "bg_be", "load": {"type": "continuous"}, "client": {"model_name": "resnet152"}},
]}
H100_NAME = "NVIDIA H100 80GB HBM3"
H200_NAME = "NVIDIA H200"  # what the driver calls the H200 SXM (2026-11-27 run)


@pytest.fixture(scope="module")
def wl_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("wl") / "synth.json"
    p.write_text(json.dumps(WORKLOAD))
    return p


def _gpu_doc(wl_file: Path, policies: list[str], contention: str, *, duration: float = 0.4,
             rate_scale: float = 1.0, profiles_dir: str | None = None,
             host: object = None) -> dict:
    """A simulator run dressed as a GPU result (what gpu_check.sh's DISB step writes)."""
    wl = load_workload(str(wl_file))
    if rate_scale != 1.0:
        wl = wl.scaled(rate_scale)
    cfg = BenchConfig(device="sim", duration=duration, gpu="h100", scale="scaled",
                      sim_models="zoo", contention=contention, progress=False,
                      standalone_n=5, profiles=profiles_dir, host=host)
    bench = Bench(wl, cfg)
    doc = build_report(bench, [bench.run_policy(p) for p in policies])
    doc.update(device="cuda", gpu=None, contention=None, dkp_placement=None)
    return doc


# -- profile files ----------------------------------------------------------------------


def _measured(plan_name: str, factor: float, gpu_name: str = H100_NAME) -> profiles.ModelProfile:
    from av_infer.bench.harness import _cached_plan
    from av_infer.model import zoo

    plan = _cached_plan(str(zoo.path(plan_name, variant="scaled")), plan_name)
    prof = profiles.derive_profile(plan, "h100")
    for kp in prof.kernels:
        kp.duration_us *= factor
    prof.source, prof.variant = "measured", "scaled"
    prof.gpu = {"name": gpu_name, "sms": 132, "clock_sm_mhz": 1980, "clock_mem_mhz": 2619}
    prof.kernels[0].vendor = "cudnn"
    return prof


def test_profile_format_round_trips_new_fields_and_reads_old_files(tmp_path) -> None:
    prof = _measured("vgg19", 1.0)
    back = profiles.ModelProfile.from_json(prof.to_json())
    assert back == prof and back.gpu["clock_sm_mhz"] == 1980
    assert back.kernels[0].vendor == "cudnn" and back.kernels[0].kind == "conv"
    old = json.loads(prof.to_json())  # a file written before the optional fields
    for k in ("source", "gpu", "variant"):
        old.pop(k)
    for k in old["kernels"]:
        k.pop("kind")
        k.pop("vendor")
    legacy = profiles.ModelProfile.from_json(json.dumps(old))
    assert legacy.source == "" and legacy.gpu is None and legacy.kernels[0].vendor == ""


def test_profile_dir_loads_by_model_skips_block_profiles_and_refuses_duplicates(tmp_path) -> None:
    prof = _measured("vgg19", 1.0)
    paths = profiles.save_profile_dir([prof], tmp_path)
    assert paths == [tmp_path / "vgg19.profile.json"]
    (tmp_path / "x.profile.json").write_text(json.dumps({"format": 1, "kind": "blocks"}))
    got = profiles.load_profile_dir(tmp_path)
    assert list(got) == ["vgg19"] and got["vgg19"].source == "measured"
    prof.save(tmp_path / "vgg19_again.profile.json")
    with pytest.raises(ValueError, match="two profiles of 'vgg19'"):
        profiles.load_profile_dir(tmp_path)
    (tmp_path / "vgg19_again.profile.json").write_text("{not json")
    with pytest.raises(ValueError, match="vgg19_again.profile.json: not JSON"):
        profiles.load_profile_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        profiles.load_profile_dir(tmp_path / "absent")


def test_gpu_key_maps_driver_names() -> None:
    assert profiles.gpu_key(H100_NAME) == "h100"
    assert profiles.gpu_key("H100-SXM5-80GB") == "h100"
    assert profiles.gpu_key(H200_NAME) == "h200"
    assert profiles.gpu_key("AMD Instinct MI50") == "mi50"
    assert profiles.gpu_key("CPU emulator (docs/cuda_emu.md)") is None
    # a name that merely contains a key is another product (Grace Hopper), not an H200
    assert profiles.gpu_key("NVIDIA GH200 480GB") is None


def test_h200_is_the_h100_chip_with_faster_memory() -> None:
    h100, h200 = profiles.gpu_spec("h100"), profiles.gpu_spec("H200")
    assert h200.name == "h200" and h200.bandwidth_gbs == 4800.0 and h100.bandwidth_gbs == 3350.0
    same = {f: getattr(h100, f) for f in h100.__dataclass_fields__
            if f not in ("name", "bandwidth_gbs")}
    assert same == {f: getattr(h200, f) for f in same}
    # the paper contention model keeps its memory shares: beta scales with the bandwidth
    assert sim_contention.check_model("paper", "h200") == pytest.approx(
        180.0 * 4800.0 / 3350.0, rel=0.01)


def test_profiles_of_an_h200_are_refused_for_an_h100_and_unknown_gpus_too(tmp_path) -> None:
    h200 = _measured("vgg19", 1.0, H200_NAME)
    with pytest.raises(ValueError, match="measured on NVIDIA H200 \\(h200\\).*--gpu h200"):
        profiles.check_profiles_gpu({"vgg19": h200}, "h100")
    profiles.check_profiles_gpu({"vgg19": h200}, "h200")
    with pytest.raises(ValueError, match="measured on NVIDIA H100.*--gpu h100"):
        profiles.check_profiles_gpu({"vgg19": _measured("vgg19", 1.0)}, "h200")
    # a real GPU the simulator has no spec for is not taken for another one
    gh = _measured("vgg19", 1.0, "NVIDIA GH200 480GB")
    gh.gpu["emulated"] = False
    with pytest.raises(ValueError, match="GH200 480GB, a GPU the simulator has no spec"):
        profiles.check_profiles_gpu({"vgg19": gh}, "h100")
    emu = _measured("vgg19", 1.0, "CPU emulator (docs/cuda_emu.md)")
    emu.gpu["emulated"] = True
    profiles.check_profiles_gpu({"vgg19": emu}, "h100")  # the emulator: accepted
    # the comparison takes the simulated GPU from the profiles' names
    profiles.save_profile_bundle([h200], tmp_path / "p.json")
    opts = compare_sim.CompareOptions(profiles=str(tmp_path / "p.json"))
    assert compare_sim.gpu_of([], opts, tmp_path / "g.json") == "h200"


def test_sim_bench_uses_measured_profiles_and_says_so(wl_file, tmp_path) -> None:
    profiles.save_profile_dir([_measured("vgg19", 3.0)], tmp_path)
    wl = load_workload(str(wl_file))
    base = BenchConfig(device="sim", duration=0.2, gpu="h100", scale="scaled",
                       sim_models="zoo", progress=False, standalone_n=3)
    derived = Bench(wl, base)
    measured = Bench(wl, BenchConfig(**{**base.__dict__, "profiles": str(tmp_path)}))
    assert measured.sources["vgg19"].profile_source == "measured"
    assert measured.sources["resnet152"].profile_source == "derived"
    d_ref, m_ref = derived.standalone(), measured.standalone()
    # 3x every kernel: the model alone takes ~3x (launch costs do not scale)
    assert 2.8 < m_ref["vgg19"]["p50_s"] / d_ref["vgg19"]["p50_s"] < 3.0
    assert m_ref["resnet152"]["p50_s"] == pytest.approx(d_ref["resnet152"]["p50_s"], rel=1e-9)
    doc = build_report(measured, [])
    assert doc["profiles"] == {"dir": str(tmp_path), "sim_models": "zoo",
                               "by_model": {"vgg19": "measured", "resnet152": "derived"}}
    assert doc["models"]["vgg19"]["profile"] == "measured"
    assert H100_NAME in doc["models"]["vgg19"]["source"]


def test_measured_profiles_of_another_gpu_or_plan_are_refused(wl_file, tmp_path) -> None:
    wl = load_workload(str(wl_file))
    cfg = BenchConfig(device="sim", duration=0.2, gpu="mi50", scale="scaled",
                      sim_models="zoo", progress=False, profiles=str(tmp_path))
    profiles.save_profile_dir([_measured("vgg19", 1.0)], tmp_path)
    with pytest.raises(ValueError, match="measured on NVIDIA H100.*--gpu h100"):
        Bench(wl, cfg)
    prof = _measured("vgg19", 1.0)
    prof.kernels.pop()
    prof.save(tmp_path / "vgg19.profile.json")
    with pytest.raises(ValueError, match="kernels, the zoo:vgg19/scaled plan has"):
        Bench(wl, BenchConfig(**{**cfg.__dict__, "gpu": "h100"}))


def test_sim_device_reads_a_profile_directory(tmp_path) -> None:
    from av_infer.bench.harness import _cached_plan
    from av_infer.model import zoo

    prof = _measured("vgg19", 2.0)
    profiles.save_profile_dir([prof], tmp_path)
    dev = SimDevice(gpu="h100", profiles=str(tmp_path))
    plan = _cached_plan(str(zoo.path("vgg19", variant="scaled")), "vgg19")
    h = dev.load_plan(plan)
    assert dev.profile_of(h).source == "measured"
    assert h.dur_s[0] == pytest.approx(prof.kernels[0].duration_us * 1e-6)
    with pytest.raises(ValueError, match="measured on NVIDIA H100"):
        SimDevice(gpu="mi50", profiles=str(tmp_path))


def test_bench_cli_profiles_flag(wl_file, tmp_path, capsys) -> None:
    profiles.save_profile_dir([_measured("vgg19", 1.0)], tmp_path / "p")
    rc = main(["bench", "--workload", str(wl_file), "--policy", "rt_only", "--gpu", "h100",
               "--scale", "scaled", "--sim-models", "zoo", "--profiles", str(tmp_path / "p"),
               "--duration", "0.1", "--standalone-n", "2", "--no-progress", "--json", "-"])
    out = capsys.readouterr()
    assert rc == 0
    doc = json.loads(out.out)
    assert doc["profiles"]["by_model"] == {"vgg19": "measured", "resnet152": "derived"}
    assert "[measured profile]" in out.err
    rc = main(["bench", "--workload", str(wl_file), "--profiles", str(tmp_path / "none"),
               "--no-progress"])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


# -- the twin ---------------------------------------------------------------------------


def test_twin_of_a_run_reproduces_it_exactly(wl_file, tmp_path) -> None:
    profiles.save_profile_dir([_measured("vgg19", 2.0)], tmp_path / "p")
    gdoc = _gpu_doc(wl_file, ["rt_only", "streams", "reef"], "calibrated", rate_scale=0.5,
                    profiles_dir=str(tmp_path / "p"))
    bundle = tmp_path / "disb_cuda.json"
    bundle.write_text(json.dumps({"policies": {"synth": gdoc}, "sweep_c": {}}))
    opts = compare_sim.CompareOptions(gpu=None, contention="calibrated",
                                      profiles=str(tmp_path / "p"))
    doc = compare_sim.run_compare(bundle, opts)
    assert doc["gpu"] == "h100"  # from the measured profiles
    pols = {r["policy"] for r in doc["rows"]}
    assert pols == {"standalone", "rt_only", "streams", "reef"}
    judged = [r for r in doc["rows"] if r["limit"] is not None]
    assert len(judged) == 9 and doc["within"] == doc["judged"] == 9
    for r in doc["rows"]:
        assert set(r) >= {"workload", "policy", "metric", "sim", "gpu", "rel_err"}
        assert r["workload"] == "synth"
        if r["gpu"]:
            assert r["rel_err"] == 0.0, r
    assert doc["sim"]["synth"]["rate_scale"] == 0.5
    assert doc["sim"]["synth"]["profiles"]["by_model"]["vgg19"] == "measured"
    # another contention model is a different simulator: the streams rows move
    other = compare_sim.run_compare(bundle, compare_sim.CompareOptions(
        contention="none", profiles=str(tmp_path / "p"), policies=["streams"]))
    p50 = next(r for r in other["rows"] if r["metric"] == "rt_p50_ms")
    assert p50["rel_err"] < 0
    assert "streams" in compare_sim.format_table(other)


def test_standalone_calibration_scales_derived_profiles_to_the_gpu(wl_file, tmp_path) -> None:
    gdoc = _gpu_doc(wl_file, ["rt_only"], "calibrated", duration=0.2)
    for m in gdoc["models"].values():
        m["standalone_p50_ms"] *= 4.0  # the "GPU" is 4x slower than the derived profile
    f = tmp_path / "g.json"
    f.write_text(json.dumps(gdoc))
    opts = compare_sim.CompareOptions(gpu="h100", calibrate="standalone")
    doc = compare_sim.run_compare(f, opts)
    sa = [r for r in doc["rows"] if r["policy"] == "standalone"]
    assert len(sa) == 2 and all(abs(r["rel_err"]) < 0.01 for r in sa)
    assert set(doc["sim"]["synth"]["profiles"]["by_model"].values()) == {"derived-scaled"}


def test_gpu_results_that_are_not_are_refused(tmp_path) -> None:
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="no DISB result"):
        compare_sim.load_gpu_results(f)
    with pytest.raises(ValueError, match="not JSON"):
        (tmp_path / "y.json").write_text("{")
        compare_sim.load_gpu_results(tmp_path / "y.json")


def test_compare_sim_cli_writes_sim_fidelity_rows(wl_file, tmp_path, capsys) -> None:
    gdoc = _gpu_doc(wl_file, ["rt_only"], "calibrated", duration=0.2)
    f = tmp_path / "g.json"
    f.write_text(json.dumps(gdoc))
    out = tmp_path / "sim_fidelity.json"
    rc = main(["bench", "--compare-sim", str(f), "--gpu", "h100", "--json", str(out),
               "--no-progress"])
    assert rc == 0
    assert "rt_p50_ms" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["judged"] == 3 and doc["within"] == 3
    rc = main(["bench", "--compare-sim", str(tmp_path / "absent.json"), "--gpu", "h100"])
    assert rc == 2


def test_several_gpu_files_are_compared_and_fitted_as_one(wl_file, tmp_path, capsys) -> None:
    """Two windows of GPU results (e.g. two leases, or two calls of one): --compare-sim
    F1 F2 gives each file's rows as a comparison of that file alone would, each row naming
    its file, a workload of both files twice (its twins keyed W@FILE); a refit over both
    fits every row of both; a file named twice or files of different GPUs are refused
    before anything runs."""
    first = _gpu_doc(wl_file, ["rt_only", "streams"], "beta=150", duration=0.3)
    second = _gpu_doc(wl_file, ["streams"], "beta=150", duration=0.3, rate_scale=0.5)
    other = {**second, "workload": str(wl_file.with_name("other.json"))}
    wl_file.with_name("other.json").write_text(wl_file.read_text())
    f1, f2 = tmp_path / "l1" / "disb_sim.json", tmp_path / "l2" / "disb_sim.json"
    f1.parent.mkdir()
    f2.parent.mkdir()
    f1.write_text(json.dumps({"policies": {"synth": first}}))
    f2.write_text(json.dumps({"policies": {"synth": second, "other": other}}))
    opts = compare_sim.CompareOptions(gpu="h100", contention="beta=150")
    both = compare_sim.run_compare([f1, f2], opts)
    alone = [compare_sim.run_compare(f, opts) for f in (f1, f2)]
    assert both["gpu_file"] == [str(f1), str(f2)] and alone[0]["gpu_file"] == str(f1)
    assert both["rows"] == alone[0]["rows"] + alone[1]["rows"]
    assert {r["gpu_file"] for r in alone[1]["rows"]} == {str(f2)}
    assert both["judged"] == 12 and both["within"] == 12  # the truth's own beta: exact
    assert set(both["sim"]) == {f"synth@{f1}", f"synth@{f2}", "other"}
    assert both["sim"][f"synth@{f2}"]["rate_scale"] == 0.5
    text = compare_sim.format_table(both)
    assert f"[1] {f1}" in text and "synth[2]" in text and "other[2]" in text
    # one fit over both files: every row of both, and it recovers the truth's beta
    fit = contention_fit.refit([f1, f2], compare_sim.CompareOptions(gpu="h100"),
                               ["streams"], tmp_path / "fit.json", lo=10.0, hi=1000.0,
                               grid=8, refine=10)
    assert fit["from"] == [str(f1), str(f2)] and fit["workloads"] == ["synth", "synth", "other"]
    assert len(fit["rows"]) == 3 * 3 and abs(fit["beta"] / 150.0 - 1) < 0.05
    assert str(f2) in sim_contention.describe(str(tmp_path / "fit.json"), "h100")["source"]
    assert fit["from"] == sim_contention.load_params(tmp_path / "fit.json")["fit"]["from"]
    # the CLI takes several files after the flag
    out = tmp_path / "sf.json"
    rc = main(["bench", "--compare-sim", str(f1), str(f2), "--gpu", "h100", "--contention",
               "beta=150", "--json", str(out), "--no-progress"])
    assert rc == 0 and json.loads(out.read_text())["rows"] == both["rows"]
    capsys.readouterr()
    with pytest.raises(ValueError, match="named twice"):
        compare_sim.run_compare([f1, tmp_path / "l1" / ".." / "l1" / "disb_sim.json"], opts)
    h200 = {**first, "gpu": H200_NAME}
    h100 = {**second, "gpu": H100_NAME}
    f1.write_text(json.dumps(h200))
    f2.write_text(json.dumps(h100))
    with pytest.raises(ValueError, match="measured on different GPUs"):
        compare_sim.gpu_of(compare_sim.load_gpu_files([f1, f2]),
                           compare_sim.CompareOptions(), [f1, f2])
    rc = main(["bench", "--refit-contention", str(f1), str(f2), "--params-out",
               str(tmp_path / "x.json"), "--no-progress"])
    assert rc == 2 and "different GPUs" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


# -- contention models ------------------------------------------------------------------


def test_paper_is_the_old_calibrated_model_and_files_are_checked(tmp_path) -> None:
    assert sim_contention.check_model("paper", "h100") == \
        sim_contention.check_model("calibrated", "h100") == 180.0
    p = sim_contention.save_params(tmp_path / "c.json", "h100", 42.5, {"from": "test"})
    assert sim_contention.check_model(str(p), "h100") == 42.5
    assert SimDevice(gpu="h100", contention=str(p))._beta == 42.5
    with pytest.raises(ValueError, match="fitted on h100"):
        sim_contention.check_model(str(p), "mi50")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "kind": "contention", "model": "bandwidth-share",
                               "gpu": "h100", "beta": -1}))
    with pytest.raises(ValueError, match="beta must be a number > 0"):
        sim_contention.check_model(str(bad), "h100")
    with pytest.raises(FileNotFoundError):
        sim_contention.check_model(str(tmp_path / "absent.json"), "h100")
    assert sim_contention.describe("paper", "h100")["source"].startswith("paper")


def test_refit_recovers_the_beta_of_a_synthetic_gpu(wl_file, tmp_path) -> None:
    true_beta = 150.0
    gdoc = _gpu_doc(wl_file, ["rt_only", "streams"], f"beta={true_beta}", duration=0.3)
    f = tmp_path / "disb_cuda.json"
    f.write_text(json.dumps({"policies": {"synth": gdoc}}))
    out = tmp_path / "fit.json"
    doc = contention_fit.refit(f, compare_sim.CompareOptions(gpu="h100"), ["streams"], out,
                               lo=10.0, hi=1000.0, grid=8, refine=10)
    assert abs(doc["beta"] / true_beta - 1) < 0.05, doc["evaluations"]
    assert doc["loss_mean_sq_log"] < 1e-4
    assert {r["policy"] for r in doc["rows"]} == {"streams"}  # rt_only carries no beta
    params = sim_contention.load_params(out)
    assert params["beta"] == doc["beta"] and params["gpu"] == "h100"
    assert params["fit"]["from"] == str(f)
    assert "beta =" in contention_fit.format_fit(doc)
    with pytest.raises(ValueError, match="nothing to fit"):
        contention_fit.refit(f, compare_sim.CompareOptions(gpu="h100"), ["reef_dkp"],
                             tmp_path / "none.json")


def test_refit_on_some_workloads_leaves_the_others_held_out(wl_file, tmp_path, capsys) -> None:
    """--fit-workloads: only the named workloads' rows enter the fit (a workload whose rows
    say beta 1000 does not pull it), and one the file lacks is refused before any run."""
    fit_doc = _gpu_doc(wl_file, ["streams"], "beta=150", duration=0.3)
    other = _gpu_doc(wl_file, ["streams"], "beta=1000", duration=0.3)
    other["workload"] = str(wl_file.with_name("other.json"))
    wl_file.with_name("other.json").write_text(wl_file.read_text())
    f = tmp_path / "disb_cuda.json"
    f.write_text(json.dumps({"policies": {"synth": fit_doc, "other": other}}))
    out = tmp_path / "fit.json"
    doc = contention_fit.refit(f, compare_sim.CompareOptions(gpu="h100"), ["streams"], out,
                               workloads=["synth"], lo=10.0, hi=1000.0, grid=8, refine=10)
    assert doc["workloads"] == ["synth"] and {r["workload"] for r in doc["rows"]} == {"synth"}
    assert abs(doc["beta"] / 150.0 - 1) < 0.05, doc["evaluations"]
    assert sim_contention.load_params(out)["fit"]["workloads"] == ["synth"]
    with pytest.raises(ValueError, match="no workload B in it \\(it has synth, other\\)"):
        contention_fit.refit(f, compare_sim.CompareOptions(gpu="h100"), ["streams"],
                             tmp_path / "none.json", workloads=["B"])
    assert not (tmp_path / "none.json").exists()
    rc = main(["bench", "--refit-contention", str(f), "--gpu", "h100", "--fit-policies",
               "streams", "--fit-workloads", "B", "--params-out", str(tmp_path / "x.json"),
               "--no-progress"])
    assert rc == 2 and "no workload B" in capsys.readouterr().err


# -- measured profiles from the cuda device's profiler (CPU emulator) --------------------


def test_gpu_profiles_writes_measured_files_on_the_emulator(tmp_path) -> None:
    from av_infer.bench import gpu_profiles
    from av_infer.devices.cuda import availability
    from tests.checks import require

    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")
    bundle = tmp_path / "b" / "sim_profiles.json"
    rc = gpu_profiles.main(["--device", "cuda-emu", "--models", "tiny_cnn", "--variant",
                            "scaled", "--repeats", "1", "--out", str(tmp_path),
                            "--bundle", str(bundle)])
    assert rc == 0
    got = profiles.load_profile_dir(tmp_path)
    assert profiles.load_profile_dir(bundle) == got  # the one-file form holds the same
    prof = got["tiny_cnn"]
    assert prof.source == "measured" and prof.variant == "scaled"
    assert prof.gpu["emulated"] is True and prof.gpu["sms"] == prof.sms > 0
    assert all(k.duration_us > 0 and k.blocks_per_sm >= 1 and k.kind for k in prof.kernels)
    assert all(k.vendor == "" for k in prof.kernels)  # our own kernels only, today


def test_gpu_profiles_names_vendor_ops_on_the_emulator(tmp_path) -> None:
    from av_infer.bench import gpu_profiles
    from av_infer.devices.cuda import availability
    from tests.checks import require

    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")
    bundle = tmp_path / "v.json"
    rc = gpu_profiles.main(["--device", "cuda-emu", "--vendor", "force", "--models",
                            "tiny_cnn", "--variant", "scaled", "--repeats", "1",
                            "--bundle", str(bundle)])
    assert rc == 0
    prof = profiles.load_profile_dir(bundle)["tiny_cnn"]
    assert prof.gpu["vendor_mode"] == "force"
    by_kind = {(k.kind, k.vendor) for k in prof.kernels}
    assert ("conv", "cudnn") in by_kind and ("gemm", "cublaslt") in by_kind
    assert all(k.vendor == "" for k in prof.kernels if k.kind not in ("conv", "gemm"))
    assert all(k.duration_us > 0 for k in prof.kernels)


# -- the GPU step of the comparison (scripts/gpu_sim_steps.sh disb) -----------------------


def test_reef_dkp_on_the_cuda_path_compiles_its_padded_module_before_the_run(capsys) -> None:
    """The DISB harness on the cuda code path (the emulator): a padding policy's runtime
    comes with the padded module over every resident plan ready (one module, none still
    compiling), so the window measures padded launches from its first request; a policy
    without padding compiles none."""
    from av_infer.devices.cuda import availability
    from tests.checks import require

    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")
    wl = load_workload("A")
    bench = Bench(wl, BenchConfig(device="cuda-emu", scale="scaled", progress=False))
    for policy, modules in (("reef", 0), ("reef_dkp", 1)):
        rt, sim = bench._runtime(policy, 4)
        try:
            assert sim is None
            pad = rt.device.telemetry()["padding"]
            assert pad["modules"] == modules and pad["compiling"] == 0 and not pad["errors"]
        finally:
            rt.close(drain=False)
    err = capsys.readouterr().err
    assert "padded dispatcher module of vgg19, resnet152 ready in" in err


def test_gpu_sim_steps_disb_dry_run_keeps_what_finished(tmp_path) -> None:
    """scripts/gpu_sim_steps.sh disb without a GPU (SIM_DEVICE=sim): the bundle holds each
    workload that finished under every policy, a workload that fails makes the step's exit
    1 without losing the others, and each workload's line says its exit and seconds."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "SIM_DEVICE": "sim", "SIM_WORKLOADS": "A,no_such_workload",
           "SIM_DISB_S": "0.2", "PY": sys.executable, "TMPDIR": str(tmp_path)}
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(root / "scripts" / "gpu_sim_steps.sh"), "disb",
                          str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads((out / "disb_sim.json").read_text())
    assert list(doc["policies"]) == ["A"]
    assert list(doc["policies"]["A"]["policies"]) == ["rt_only", "streams", "reef", "reef_dkp"]
    assert doc["policies"]["A"]["rate_scale"] == 0.5
    assert compare_sim.load_gpu_results(out / "disb_sim.json")[0]["workload"] == "A"
    assert "== gpu_sim_steps: disb A rc 0 in " in res.stdout
    assert "== gpu_sim_steps: disb no_such_workload rc 2 in " in res.stdout
    assert not list(tmp_path.glob("gpu_sim_parts.*"))  # the parts folder is removed


def test_host_refit_recovers_the_start_work_of_a_synthetic_gpu(wl_file, tmp_path, capsys) -> None:
    """A "GPU" whose requests start 800 us + 6 us per kernel after they are started (the
    simulator with that host model): --refit-host finds both numbers from the standalone
    and rt_only rows; comparing with the file reproduces the GPU's RT rows exactly."""
    from av_infer.bench import host_fit
    from av_infer.devices import sim_host

    true = sim_host.HostModel(800.0, 6.0, 0.0, "h100")
    gdoc = _gpu_doc(wl_file, ["rt_only", "streams"], "beta=150", duration=0.3, host=true)
    f = tmp_path / "disb_cuda.json"
    f.write_text(json.dumps({"policies": {"synth": gdoc}}))
    out = tmp_path / "host.json"
    opts = compare_sim.CompareOptions(gpu="h100", contention="beta=150")
    doc = host_fit.refit_host(f, opts, out, complete=False)
    assert doc["start_us"] == pytest.approx(800.0, abs=0.5)
    assert doc["per_kernel_us"] == pytest.approx(6.0, abs=0.01)
    assert doc["complete_us"] == 0.0 and doc["complete"]["fitted"] is False
    assert {p["what"] for p in doc["start"]["points"]} == {"standalone_p50",
                                                           "rt_only first_kernel_p50"}
    assert sim_host.load_params(out).gpu == "h100"
    assert "us/kernel" in host_fit.format_fit(doc)
    rc = main(["bench", "--compare-sim", str(f), "--gpu", "h100", "--contention", "beta=150",
               "--host", str(out), "--no-progress", "--json", str(tmp_path / "fid.json")])
    assert rc == 0
    fid = json.loads((tmp_path / "fid.json").read_text())
    assert fid["host"] == str(out) and fid["sim"]["synth"]["host_model"]["start_us"] > 0
    rt = [r for r in fid["rows"] if r["metric"] in ("rt_p50_ms", "rt_first_kernel_p50_us")]
    assert rt and all(abs(r["rel_err"]) < 1e-3 for r in rt), rt
    # without the host model the same rows are off by the start work
    plain = compare_sim.run_compare(f, opts)
    fk = [r for r in plain["rows"] if r["metric"] == "rt_first_kernel_p50_us"]
    assert fk and all(r["rel_err"] < -0.9 for r in fk)


def test_host_refit_completion_term_searches_and_writes_its_file(wl_file, tmp_path) -> None:
    from av_infer.bench import host_fit
    from av_infer.devices import sim_host

    gdoc = _gpu_doc(wl_file, ["rt_only", "streams"], "beta=150", duration=0.3,
                    host=sim_host.HostModel(500.0, 4.0, 20.0, "h100"))
    f = tmp_path / "disb_cuda.json"
    f.write_text(json.dumps({"policies": {"synth": gdoc}}))
    out = tmp_path / "host.json"
    doc = host_fit.refit_host(f, compare_sim.CompareOptions(gpu="h100", contention="beta=150"),
                              out, policies=["streams"], grid=4, refine=2, hi=50.0)
    evals = doc["complete"]["evaluations"]
    assert [e[0] for e in evals][:1] == [0.0] and len(evals) == 4 + 2 + 2
    assert 0.0 <= doc["complete_us"] <= 50.0
    assert {r["policy"] for r in doc["complete"]["rows"]} == {"streams"}
    assert sim_host.load_params(out).complete_us == doc["complete_us"]
    with pytest.raises(ValueError, match="nothing to fit complete_us"):
        host_fit.refit_host(f, compare_sim.CompareOptions(gpu="h100"), tmp_path / "n.json",
                            policies=["reef_dkp"])
    assert not (tmp_path / "n.json").exists()
