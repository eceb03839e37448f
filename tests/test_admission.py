"""The admission (``av_infer/admission.py``: ``Runtime.submit``/``infer``'s request builder)
is compiled where built; the same source run by the interpreter decides alike: the same
typed error for each bad argument (first thing wrong, nothing queued, counted), the same
deadlines for good ones, unique increasing ids, and refusal once the runtime is closed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from av_infer import Runtime
from av_infer.errors import (
    InvalidInputError,
    InvalidParameterError,
    RuntimeClosedError,
    UnknownModelError,
)
from av_infer.model import zoo
from tests.checks import run_in_form

#: the script both forms run: each case's outcome (error type and message, or the
#: request's deadlines relative to its arrival), the ids, the submit-error counts
_CASES = r'''
import json, math, re, sys
import numpy as np
import av_infer
from av_infer import Runtime
from av_infer.model import zoo
x = zoo.sample_inputs("tiny_mlp")
name = next(iter(x))
out = []
def rel(v, a):
    return "inf" if v == math.inf else round(v - a, 9)
with Runtime("cpu", max_be_streams=1) as r:
    r.load_model("m", zoo.path("tiny_mlp", "scaled"))
    r.configure_client("cam", "RT", relative_deadline=0.5, hard_deadline=0.8)
    now = r.now()
    cases = [
        ("ok", "m", x, {}),
        ("ok_rt_client", "m", x, {"client": "cam"}),
        ("soft_only", "m", x, {"client": "cam", "deadline": now + 0.9, "arrival": now}),
        ("hard_alone", "m", x, {"hard_deadline": now + 2.0, "arrival": now}),
        ("unknown_model", "nope", x, {}),
        ("bad_client", "m", x, {"client": ""}),
        ("bad_client_type", "m", x, {"client": 3}),
        ("bad_priority", "m", x, {"priority": "XX"}),
        ("not_a_dict", "m", [1], {}),
        ("missing", "m", {}, {}),
        ("extra", "m", {**x, "zz": x[name]}, {}),
        ("shape", "m", {name: np.zeros((2, 3), np.float32)}, {}),
        ("dtype", "m", {name: x[name].astype(np.float64)}, {}),
        ("not_array", "m", {name: [0.0]}, {}),
        ("arrival_nan", "m", x, {"arrival": float("nan")}),
        ("arrival_text", "m", x, {"arrival": "soon"}),
        ("arrival_old", "m", x, {"arrival": now - 1e6}),
        ("deadline_nan", "m", x, {"deadline": float("nan")}),
        ("hard_before_soft", "m", x, {"deadline": now + 2.0, "hard_deadline": now + 1.0}),
        ("drop_late_text", "m", x, {"drop_late": "yes"}),
        ("drop_late_np", "m", x, {"drop_late": np.bool_(True)}),
        ("group_unknown", "m", x, {"variant_group": "g"}),
    ]
    ids = []
    for label, model, inp, kw in cases:
        fut = r.submit(model, inp, **kw)
        try:
            res = fut.result(timeout=30)
        except Exception as e:
            # the message without its figures (clock readings differ run to run)
            msg = re.sub(r"[0-9][0-9.e+-]*", "#", str(e))
            out.append([label, type(e).__name__, msg[:90]])
        else:
            ids.append(res.request_id)
            a = res.timings.arrival
            out.append([label, "ok", rel(res.deadline, a), rel(res.hard_deadline, a),
                        sorted(res.outputs)])
    out.append(["ids_increasing", ids == sorted(ids) and len(set(ids)) == len(ids)])
    out.append(["submit_errors", r.stats()["submit_errors"]])
    r.close()
    try:
        r.submit("m", x).result(timeout=30)
    except Exception as e:
        out.append(["closed", type(e).__name__])
print(json.dumps(out))
'''


def _run(interpreted: bool) -> list:
    return json.loads(run_in_form(_CASES, ("admission", "inputs", "request_options",
                                           "registry"), interpreted))


def test_compiled_and_interpreted_admission_agree() -> None:
    compiled = _run(False)
    assert compiled == _run(True)
    got = {row[0]: row[1:] for row in compiled}
    assert got["ok"][:3] == ["ok", "inf", "inf"]
    assert got["ok_rt_client"][:3] == ["ok", 0.5, 0.8]
    # a per-request soft deadline past the client's hard one moves the hard one with it
    assert got["soft_only"][:3] == ["ok", 0.9, 0.9]
    assert got["hard_alone"][:3] == ["ok", 2.0, 2.0]  # a hard deadline alone: soft = hard
    for label, err in (("unknown_model", "UnknownModelError"),
                       ("bad_client", "InvalidParameterError"),
                       ("bad_client_type", "InvalidParameterError"),
                       ("bad_priority", "InvalidParameterError"),
                       ("not_a_dict", "InvalidInputError"), ("missing", "InvalidInputError"),
                       ("extra", "InvalidInputError"), ("shape", "InvalidInputError"),
                       ("dtype", "InvalidInputError"), ("not_array", "InvalidInputError"),
                       ("arrival_nan", "InvalidParameterError"),
                       ("arrival_text", "InvalidParameterError"),
                       ("arrival_old", "InvalidParameterError"),
                       ("deadline_nan", "InvalidParameterError"),
                       ("hard_before_soft", "InvalidParameterError"),
                       ("drop_late_text", "InvalidParameterError"),
                       ("group_unknown", "UnknownModelError")):
        assert got[label][0] == err, (label, got[label])
    assert got["drop_late_np"][0] == "ok"
    assert got["ids_increasing"] == [True]
    assert sum(got["submit_errors"][0].values()) == 17
    assert got["closed"] == ["RuntimeClosedError"]


def test_borrowed_and_copied_inputs() -> None:
    """``infer`` without a timeout reads the caller's arrays in place; ``submit`` copies
    them (a later write by the caller cannot change a queued request)."""
    x = zoo.sample_inputs("tiny_mlp")
    with Runtime("cpu", max_be_streams=1) as r:
        r.load_model("m", zoo.path("tiny_mlp", "scaled"))
        want = r.infer("m", x).outputs
        fut = r.submit("m", x)
        for v in x.values():
            v[...] = 0
        got = fut.result(timeout=30).outputs
        assert all(np.array_equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("bad,err", [
    ({"client": None}, InvalidParameterError),
    ({"priority": 7}, InvalidParameterError),
    ({"deadline": "later"}, InvalidParameterError),
])
def test_a_bad_option_fails_the_future_not_the_call(bad: dict, err: type) -> None:
    x = zoo.sample_inputs("tiny_mlp")
    with Runtime("cpu", max_be_streams=1) as r:
        r.load_model("m", zoo.path("tiny_mlp", "scaled"))
        fut = r.submit("m", x, **bad)  # never raises
        with pytest.raises(err):
            fut.result(timeout=30)
        with pytest.raises(InvalidInputError):
            r.infer("m", {"nope": np.zeros(1, np.float32)})
        with pytest.raises(UnknownModelError):
            r.infer("nope", x)
    with pytest.raises(RuntimeClosedError):
        r.infer("m", x)
