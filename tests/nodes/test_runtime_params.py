"""The runtime host's parameter table is the one source of every range (issue 31, review
point "node validator bounds differ from declared ranges"): for every ranged parameter the
validator accepts both ends of the declared range and refuses just outside them, so what
``ros2 param describe`` publishes (the descriptor made from the table) is what the node
accepts. Also: the precision parameters (issue 30 item 4) parse and refuse at the
boundary. No ROS context: rclpy is imported, never initialised.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("rclpy")

from av_infer_nodes.runtime_build import check_precisions  # noqa: E402
from av_infer_nodes.runtime_params import (  # noqa: E402
    defaults,
    model_precisions,
    param_table,
    ranges,
    validate,
)

from av_infer import PRECISIONS, InvalidParameterError, Runtime  # noqa: E402

RANGED = [p for p in param_table() if p.int_range or p.float_range]


def _edges(prm):
    """(values at the range's ends, values just outside them)."""
    if prm.int_range:
        lo, hi = prm.int_range
        return (lo, hi), (lo - 1, hi + 1)
    lo, hi = prm.float_range
    return ((float(lo), float(hi)),
            (math.nextafter(float(lo), -math.inf), math.nextafter(float(hi), math.inf)))


def _merged(name, value):
    # deadline_miss_warn <= deadline_miss_error is a rule between two parameters: give the
    # other one room so only the range decides
    m = dict(defaults(), deadline_miss_warn=1, deadline_miss_error=100000)
    m[name] = value
    return m


def test_every_range_is_checked():
    assert {p.name for p in RANGED} == set(ranges())
    # the ones the review found differing (and those the validator did not check at all)
    assert {"max_queue_depth", "be_min_share", "eq2_beta", "eq2_b_thrd", "rate_window_ms",
            "fixed_max", "cache_budget_mb", "batch_max", "batch_quantum_ms",
            "drain_timeout_s"} <= set(ranges())


@pytest.mark.parametrize("prm", RANGED, ids=lambda p: p.name)
def test_validator_agrees_with_the_declared_range(prm):
    """The value check of every ranged parameter, live or read-only (read-only ones are
    range-checked by ROS at declaration from the same descriptor, and refused live)."""
    inside, outside = _edges(prm)
    as_live = lambda n: False  # noqa: E731 - the value check alone
    for v in inside:
        assert validate(prm.name, v, _merged(prm.name, v), None, as_live) is None, (prm, v)
    for v in outside:
        reason = validate(prm.name, v, _merged(prm.name, v), None, as_live)
        assert reason and prm.name in reason, (prm, v, reason)
    wrong_type = "1" if prm.int_range else 1  # a string for an int, an int for a double
    assert validate(prm.name, wrong_type, _merged(prm.name, wrong_type), None, as_live)
    if prm.float_range:
        for v in (math.nan, math.inf):
            assert validate(prm.name, v, _merged(prm.name, v), None, as_live)
    if prm.read_only:  # live: refused whatever the value
        lo = inside[0]
        assert "read-only" in validate(prm.name, lo, _merged(prm.name, lo), None,
                                       lambda n: True)


def test_deadline_miss_order_is_still_checked():
    m = dict(defaults(), deadline_miss_warn=5, deadline_miss_error=3)
    assert "must not be above" in validate("deadline_miss_warn", 5, m, None, lambda n: False)


# -- precision (issue 30 item 4) ----------------------------------------------------------
def test_precision_parameters_are_declared_read_only():
    table = {p.name: p for p in param_table()}
    assert table["precision"].default == "fp32" and table["precision"].read_only
    assert table["precision"].constraints == "one of " + ", ".join(PRECISIONS)
    assert table["model_precisions"].read_only and table["model_precisions"].array_of is str


def test_model_precisions_per_entry():
    p = dict(defaults(), models=["tiny_cnn", "/m/det.onnx"], precision="tf32",
             model_precisions=["det=fp16"])
    assert model_precisions(p) == {"tiny_cnn": "tf32", "/m/det.onnx": "fp16"}
    p["model_precisions"] = ["/m/det.onnx=fp32"]  # the entry as written in models
    assert model_precisions(p)["/m/det.onnx"] == "fp32"
    assert model_precisions(dict(defaults())) == {"tiny_cnn": "fp32"}


@pytest.mark.parametrize("change, words", [
    ({"precision": "fp64"}, "precision"),
    ({"model_precisions": ["tiny_cnn=int8"]}, "int8"),
    ({"model_precisions": ["tiny_cnn"]}, "MODEL=PRECISION"),
    ({"model_precisions": ["other=fp16"]}, "not an entry of models"),
    ({"model_precisions": ["tiny_cnn=fp16", "tiny_cnn=fp32"]}, "twice"),
])
def test_model_precisions_refusals(change, words):
    with pytest.raises(InvalidParameterError, match=words):
        model_precisions(dict(defaults(), **change))


def test_cpu_refuses_what_it_cannot_run_before_anything_loads():
    rt = Runtime(device="cpu")
    try:
        assert rt.precisions == ("fp32",)
        check_precisions(rt, {"tiny_cnn": "fp32"})
        with pytest.raises(InvalidParameterError, match=r"fp16.*device cpu runs fp32"):
            check_precisions(rt, {"tiny_cnn": "fp32", "det": "fp16"})
        assert rt.models() == []
    finally:
        rt.close()
