"""``models check`` compares with ONNX Runtime as ``numpy.allclose`` does (rtol + atol)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from av_infer.cli import main
from av_infer.model.check import (
    CPU_TOLERANCE,
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    allclose_report,
    check_model,
    max_rel_err,
)

KEYS = {"ok", "max_abs_err", "max_rel_err", "worst_excess"}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("rtol,atol", [(DEFAULT_RTOL, DEFAULT_ATOL), (1e-3, 0.0), (0.0, 1e-3),
                                       (1e-2, 1e-2)])
def test_allclose_report_agrees_with_numpy(seed: int, rtol: float, atol: float) -> None:
    rng = np.random.default_rng(seed)
    want = (rng.standard_normal((4, 33)) * 10.0 ** rng.integers(-4, 3)).astype(np.float32)
    # noise around the tolerance, so that both outcomes occur over the seeds
    noise = rng.standard_normal(want.shape) * (atol + rtol * np.abs(want)) * rng.uniform(0.1, 3)
    got = (want + noise).astype(np.float32)
    rep = allclose_report(got, want, rtol=rtol, atol=atol)
    assert set(rep) == KEYS
    assert rep["ok"] == np.allclose(got, want, rtol=rtol, atol=atol)
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert rep["max_abs_err"] == pytest.approx(diff.max())
    assert rep["max_rel_err"] == max_rel_err(got, want)
    excess = (diff - (atol + rtol * np.abs(want.astype(np.float64)))).max()
    assert rep["worst_excess"] == pytest.approx(excess)
    # the float64 excess agrees with the (float32) allclose decision up to rounding
    near_boundary = abs(rep["worst_excess"]) < 1e-6 * (1 + float(np.abs(want).max()))
    assert rep["ok"] == (rep["worst_excess"] <= 0) or near_boundary


def test_near_zero_reference_passes_allclose_but_not_the_old_metric() -> None:
    """A probability map near zero: tiny absolute errors, huge relative to max |want|."""
    rng = np.random.default_rng(0)
    want = (rng.uniform(0, 1e-6, size=(1, 1, 16, 16))).astype(np.float32)
    got = (want + rng.uniform(-5e-6, 5e-6, size=want.shape)).astype(np.float32)
    assert max_rel_err(got, want) > CPU_TOLERANCE  # the old check fails
    rep = allclose_report(got, want, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)
    assert rep["ok"] and np.allclose(got, want, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)
    assert rep["worst_excess"] <= 0 and rep["max_rel_err"] > CPU_TOLERANCE
    # ...and a ~2e-3 absolute disagreement needs a larger atol
    far = want + np.float32(2e-3)
    assert not allclose_report(far, want)["ok"]
    assert allclose_report(far, want, atol=3e-3)["ok"]


def test_nan_and_inf_follow_numpy() -> None:
    want = np.array([1.0, np.inf, -np.inf, 2.0], dtype=np.float32)
    assert allclose_report(want.copy(), want)["ok"]  # equal infinities pass
    assert allclose_report(want.copy(), want)["max_abs_err"] == 0.0
    nan = want.copy()
    nan[0] = np.nan
    assert not allclose_report(nan, want)["ok"] and not np.allclose(nan, want)
    assert not allclose_report(nan, nan)["ok"]  # equal_nan=False, like numpy.allclose


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_integer_outputs_need_exact_equality(dtype) -> None:
    want = np.array([[0, 1, 1], [1, 0, 1]], dtype=dtype)
    rep = allclose_report(want.copy(), want, rtol=1.0, atol=10.0)
    assert rep["ok"] and rep["max_abs_err"] == 0.0 and rep["worst_excess"] == 0.0
    got = want.copy()
    got[0, 0] = 1
    rep = allclose_report(got, want, rtol=1.0, atol=10.0)  # the tolerances do not apply
    assert not rep["ok"] and rep["max_abs_err"] == 1.0 and rep["worst_excess"] > 0


def test_shape_mismatch_is_not_ok() -> None:
    want = np.zeros((2, 3), dtype=np.float32)
    for got in (np.zeros((3, 2), np.float32), np.zeros((1, 2, 3), np.float32),
                np.zeros((3,), np.float32)):
        rep = allclose_report(got, want, rtol=1.0, atol=1.0)
        assert not rep["ok"] and rep["worst_excess"] == float("inf")
    # numpy.allclose would broadcast (1, 3) against (2, 3); we do not
    assert np.allclose(np.zeros((1, 3)), want)
    assert not allclose_report(np.zeros((1, 3), np.float32), want)["ok"]
    assert not allclose_report(np.zeros((2,), np.int64), np.zeros((2, 1), np.int64))["ok"]


def test_empty_outputs_and_bad_tolerances() -> None:
    rep = allclose_report(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32))
    assert rep["ok"] and rep["max_abs_err"] == 0.0
    for rtol, atol in ((-1e-4, 0.0), (0.0, -1.0), (float("nan"), 0.0), (0.0, float("inf"))):
        with pytest.raises(ValueError):
            allclose_report(np.zeros(2), np.zeros(2), rtol=rtol, atol=atol)


def test_check_model_report_fields() -> None:
    from av_infer.model import zoo

    rep = check_model(zoo.path("tiny_cnn"), name="tiny_cnn", repeats=1, rtol=1e-3, atol=1e-6)
    d = rep.to_dict()
    assert rep.ok and d["ok"] is True
    assert d["rtol"] == 1e-3 and d["atol"] == 1e-6 and d["tolerance"] == 1e-3
    assert set(d["per_output_detail"]) == set(d["per_output"]) == {"logits"}
    assert set(d["per_output_detail"]["logits"]) == KEYS
    assert d["max_rel_err"] == d["per_output"]["logits"]
    assert d["max_abs_err"] == d["per_output_detail"]["logits"]["max_abs_err"]
    json.dumps(d)
    with pytest.raises(ValueError):
        check_model(zoo.path("tiny_cnn"), rtol=-1.0)


def test_cli_rtol_atol_json(tmp_path, capsys) -> None:
    out = tmp_path / "check.json"
    argv = ["models", "check", "tiny_cnn", "--rtol", "2e-4", "--atol", "3e-6", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["rtol"] == 2e-4 and doc["atol"] == 3e-6 and doc["ok"] is True
    assert doc["tolerance"] == 2e-4 and "max_rel_err" in doc and "max_abs_err" in doc
    assert doc["per_output_detail"]["logits"]["ok"] is True
    text = capsys.readouterr().out
    assert "rtol=0.0002" in text and "atol=3e-06" in text
    assert "max abs err" in text and "max rel err" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("tiny_cnn"))
    assert line.rstrip().endswith("ok")


def test_cli_defaults_and_json_stdout(capsys) -> None:
    assert main(["models", "check", "tiny_cnn", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)  # '-': only the JSON on stdout
    assert doc["rtol"] == DEFAULT_RTOL and doc["atol"] == DEFAULT_ATOL and doc["ok"] is True


class _ShiftedOrt:
    """An ONNX Runtime session whose float outputs are off by a constant (a noisy oracle)."""

    def __init__(self, sess, shift: float) -> None:
        self._sess, self._shift = sess, shift

    def __getattr__(self, name):
        return getattr(self._sess, name)

    def run(self, names, feed):
        return [o + np.float32(self._shift) for o in self._sess.run(names, feed)]


def test_cli_exit_status_follows_allclose(monkeypatch, capsys) -> None:
    import av_infer.model.check as check

    real = check.ort_session
    monkeypatch.setattr(check, "ort_session", lambda *a, **k: _ShiftedOrt(real(*a, **k), 2e-3))
    assert main(["models", "check", "tiny_cnn", "--json", "-"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["per_output_detail"]["logits"]["worst_excess"] > 0
    assert doc["max_abs_err"] == pytest.approx(2e-3, rel=1e-2)

    assert main(["models", "check", "tiny_cnn"]) == 1
    text = capsys.readouterr().out
    assert next(ln for ln in text.splitlines() if ln.startswith("tiny_cnn")).rstrip()[-4:] == "FAIL"
    assert "FAIL tiny_cnn/logits" in text

    assert main(["models", "check", "tiny_cnn", "--atol", "3e-3", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


@pytest.mark.parametrize("argv", [["--rtol=-1e-4"], ["--atol", "-1"], ["--rtol", "-0.5"],
                                  ["--atol=nan"], ["--rtol", "x"]])
def test_cli_rejects_bad_tolerance(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["models", "check", "tiny_cnn", *argv])
    assert exc.value.code != 0
    err = capsys.readouterr().err
    flag, _, value = argv[0].partition("=")
    value = value or argv[1]
    assert f"argument {flag}" in err and repr(value) in err
