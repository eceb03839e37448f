"""Variant groups (paper 001 §2.3): validation, utility-driven selection, statistics."""

from __future__ import annotations

import math

import pytest

from av_infer.errors import InvalidParameterError, UnknownModelError
from av_infer.qos import VariantGroup
from av_infer.qos.deciders import BatchView, FixedDecider, best_variant, plan_size
from tests.qos.qos_util import group_runtime, latency_of, x


@pytest.mark.parametrize("variants", [{}, {"a": 0.0}, {"a": 1.5}, {"a": math.nan},
                                      {"a": True}, {"": 1.0}, [("a", 1.0), ("a", 0.5)],
                                      "ab"])
def test_bad_groups_are_refused(variants: object) -> None:
    with pytest.raises(InvalidParameterError):
        VariantGroup.build("g", variants)


def test_group_orders_most_accurate_first() -> None:
    g = VariantGroup.build("g", {"fast": 0.5, "full": 1.0})
    assert g.models == ("full", "fast") and g.kappas == (1.0, 0.5)


def test_configuration_errors_change_nothing() -> None:
    rt = group_runtime()
    with pytest.raises(UnknownModelError):
        rt.define_variant_group("det", {"full": 1.0, "nope": 0.5})
    with pytest.raises(InvalidParameterError):
        rt.define_variant_group("det", {"full": 1.0, "fast": 0.0})
    with pytest.raises(InvalidParameterError):
        rt.define_variant_group("full", {"full": 1.0, "fast": 0.5})  # name of a model
    with pytest.raises(UnknownModelError, match="unknown variant group"):
        rt.configure_client("cam", variant_group="nope")
    with pytest.raises(InvalidParameterError, match="before the soft"):
        rt.configure_client("cam", soft_deadline=0.02, hard_deadline=0.01)
    assert rt.variant_groups() == {}
    rt.define_variant_group("det", {"fast": 0.5, "full": 1.0})
    assert rt.variant_groups() == {"det": {"full": 1.0, "fast": 0.5}}
    with pytest.raises(InvalidParameterError, match="variant of group"):
        rt.unload_model("fast")
    # a request naming a model outside the group, a hard deadline before the soft one
    f = rt.submit("fast", x(), variant_group="nope")
    with pytest.raises(UnknownModelError):
        f.result()
    f = rt.submit("fast", x(), deadline=rt.now() + 1.0, hard_deadline=rt.now() + 0.5)
    with pytest.raises(InvalidParameterError, match="before the"):
        f.result()
    rt.close()


def test_mismatched_variants_are_refused() -> None:
    from av_infer.model import zoo

    rt = group_runtime()
    rt.load_model("other", zoo.path("tiny_mlp"))
    with pytest.raises(InvalidParameterError, match="differ"):
        rt.define_variant_group("det", {"full": 1.0, "other": 0.5})
    rt.close()


def test_variant_selection_follows_expected_quality() -> None:
    """Loose deadlines: the accurate variant; a soft deadline only the fast one meets (and
    a hard one right after it): the fast one, since κ·V of the full one would be ~0."""
    rt = group_runtime(factor=20.0)
    l_full, l_fast = latency_of(rt, "full"), latency_of(rt, "fast")
    assert l_full > 5 * l_fast
    rt.define_variant_group("det", {"full": 1.0, "fast": 0.5})
    rt.configure_client("loose", soft_deadline=3 * l_full, hard_deadline=6 * l_full,
                        variant_group="det")
    rt.configure_client("tight", soft_deadline=2 * l_fast, hard_deadline=3 * l_fast,
                        variant_group="det")
    dev = rt.device
    got: dict[str, list] = {"loose": [], "tight": []}
    for k in range(10):  # one at a time: nothing queues
        for c in ("loose", "tight"):
            t = dev.now() + k * 4 * l_full + (0 if c == "loose" else 2 * l_full)
            dev.call_at(t, lambda c=c: got[c].append(rt.submit("full", x(), client=c)))
    dev.run()
    loose = [f.result() for f in got["loose"]]
    tight = [f.result() for f in got["tight"]]
    assert {r.model for r in loose} == {"full"} and all(r.kappa == 1.0 for r in loose)
    assert {r.model for r in tight} == {"fast"} and all(r.quality == 0.5 for r in tight)
    s = rt.stats()["variant_groups"]["det"]
    assert s["requests"] == 20 and s["served"] == {"full": 10, "fast": 10}
    assert s["share"]["fast"] == 0.5 and s["mean_utility"] == pytest.approx(0.75)
    rt.close()


def test_rt_request_to_a_group_gets_a_variant() -> None:
    rt = group_runtime(factor=20.0)
    l_fast = latency_of(rt, "fast")
    rt.define_variant_group("det", {"full": 1.0, "fast": 0.5})
    now = rt.now()
    f = rt.submit("det", x(), priority="RT", deadline=now + 2 * l_fast,
                  hard_deadline=now + 3 * l_fast)
    rt.device.run()
    r = f.result()
    assert r.model == "fast" and r.priority.name == "RT" and r.quality == 0.5
    rt.close()


def test_deciders_on_a_synthetic_view() -> None:
    lat = {(0, 1): 1.0, (0, 2): 1.2, (0, 4): 1.5, (1, 1): 0.2, (1, 2): 0.25, (1, 4): 0.3}
    view = BatchView(10.0, [(11.5, 12.0)] * 3, (1, 2, 4), (1.0, 0.5),
                     lambda v, b: lat[(v, b)])
    assert plan_size(view.sizes, 3) == 4 and plan_size(view.sizes, 9) == 4
    # batch of 3 on plan 4: full ends at 11.5 (V=1, Q=3), fast at 10.3 (Q=1.5)
    assert best_variant(view, 3) == 0
    view.busy = 0.4  # the device is busy for 0.4 s more: full ends 11.9 (V=0.2)
    assert best_variant(view, 3) == 1
    assert FixedDecider(32).decide(view) == (1, 3)
