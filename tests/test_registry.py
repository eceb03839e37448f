"""The model registry's per-submit look-up (``ModelRegistry.resolve``, av_infer/registry.py)
reads without the lock and stays what one locked look-up gives: the tables as of one
moment between changes. Runs in the form the suite runs (compiled where built; with
``AV_INFER_INTERPRETED=1`` the ``.py``, where thread switches fall between any two reads).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from av_infer.qos import VariantGroup
from av_infer.registry import DEFAULT_CLIENT, ClientConfig, ModelRegistry


def _entry(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name)


def test_resolve_reads_models_groups_and_clients() -> None:
    reg = ModelRegistry()
    a, b, ge = _entry("a"), _entry("b"), _entry("g")
    reg.add(a, None)
    reg.add(b, None)
    group = VariantGroup.build("g", {"a": 1.0, "b": 0.5})
    reg.add_group(group, ge)
    reg.set_client("cam", ClientConfig(variant_group="g"))
    assert reg.resolve("a", "x", None) == (DEFAULT_CLIENT, None, None, a)
    assert reg.resolve("nope", "x", None)[3] is None
    assert reg.resolve("g", "x", None)[3] is ge  # a group named as a model
    cfg, gname, grp, entry = reg.resolve("a", "cam", None)  # the client's group
    assert (gname, grp[0], entry) == ("g", group, ge) and cfg.variant_group == "g"
    assert reg.resolve("a", "x", "g")[1:] == ("g", reg.group("g"), ge)  # the request's
    assert reg.resolve("a", "x", "none")[1:] == ("none", None, None)
    reg.remove_group("g")  # the client falls back to the model it names
    assert reg.resolve("a", "cam", None)[1:] == (None, None, a)
    assert reg.remove("a") is a and reg.resolve("a", "x", None)[3] is None
    assert reg._gen % 2 == 0 and reg._gen > 0  # every change counted twice


def test_a_look_up_during_a_change_waits_for_the_change() -> None:
    reg = ModelRegistry()
    old, new = _entry("m"), _entry("m")
    reg.add(old, None)
    inside, release = threading.Event(), threading.Event()

    def change() -> None:  # a change under way, held half-made until released
        with reg.lock:
            reg._gen += 1
            inside.set()
            release.wait(60)
            reg.models["m"] = new
            reg._gen += 1

    w = threading.Thread(target=change)
    w.start()
    assert inside.wait(60)
    got: list[tuple] = []
    r = threading.Thread(target=lambda: got.append(reg.resolve("m", "x", None)))
    r.start()
    r.join(0.2)
    assert not got  # waiting on the lock (the change is not whole yet)
    release.set()
    r.join(60)
    w.join(60)
    assert got[0][3] is new


def test_look_ups_racing_changes_see_whole_states() -> None:
    # a group defined, a client moved onto it, the group removed (the client moved back
    # off it): a look-up sees the client on the group only together with the group
    reg = ModelRegistry()
    a, ge = _entry("a"), _entry("g")
    reg.add(a, None)
    group = VariantGroup.build("g", {"a": 1.0})
    stop = threading.Event()
    rounds = [0]

    def churn() -> None:
        while not stop.is_set():
            reg.add_group(group, ge)
            reg.set_client("cam", ClientConfig(variant_group="g"))
            reg.remove_group("g")
            rounds[0] += 1

    w = threading.Thread(target=churn)
    w.start()
    try:
        bad = []
        n = 0
        while n < 20000 or rounds[0] < 50:
            cfg, gname, grp, entry = reg.resolve("a", "cam", None)
            if gname is None:
                ok = entry is a and cfg.variant_group is None
            else:
                ok = gname == "g" and grp is not None and entry is ge
            if not ok:
                bad.append((cfg, gname, grp, entry))
            n += 1
    finally:
        stop.set()
        w.join(60)
    assert not bad, bad[:3]
