"""The learned policy (paper 001 §3.2): file format, loading, fitting, a tiny training run,
and ``av-infer qos eval --json -`` on a short trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from av_infer import Runtime
from av_infer.cli import main
from av_infer.errors import InvalidParameterError
from av_infer.qos.deciders import BatchView
from av_infer.qos.evaluate import Workload
from av_infer.qos.policy import DEFAULT_POLICY, PolicyNet, load_policy
from av_infer.qos.train import small_config, train
from tests.qos.qos_util import group_runtime, x


def test_committed_policy_loads_and_fits_the_default_group() -> None:
    net = load_policy()
    assert DEFAULT_POLICY.stat().st_size < 64_000
    assert net.n_variants == 2 and net.batch_sizes == (1, 2, 4, 8, 16, 32)
    assert net.meta["config"]["seed"] == 0  # ``av-infer qos train`` reproduces it
    rt = group_runtime(batching=True, max_batch=4, batch_mode="qos_rl")  # loads it
    rt.define_variant_group("det", {"full": 1.0, "fast": 0.5})
    futs = [rt.submit("det", x(i)) for i in range(12)]
    rt.device.run()
    assert {f.result().model for f in futs} <= {"full", "fast"}
    assert rt.stats()["batching"]["deciders"]["det"]["policy"] == "qos_rl_default"
    rt.close()


def test_roundtrip_and_bad_files(tmp_path: Path) -> None:
    net = PolicyNet.init(2, (1, 2, 4), hidden=8, seed=3)
    p = tmp_path / "p.json"
    net.save(p)
    back = load_policy(p)
    np.testing.assert_allclose(back.w1, net.w1, atol=1e-6)
    assert back.actions == net.actions
    bad = tmp_path / "bad.json"
    for text in ("not json", json.dumps({"format": "other"}),
                 p.read_text().replace('"n_pre":4', '"n_pre":5'),  # weights no longer fit
                 p.read_text().replace('"batch_sizes":[1,2,4]', '"batch_sizes":[1,2]')):
        bad.write_text(text)
        with pytest.raises(InvalidParameterError):
            load_policy(bad)
    with pytest.raises(InvalidParameterError):
        load_policy(tmp_path / "missing.json")
    with pytest.raises(InvalidParameterError):
        Runtime("sim", batch_mode="qos_rl", qos_policy=bad)  # refused before a device exists


def test_policy_that_does_not_fit_is_refused_at_configuration(tmp_path: Path) -> None:
    one = tmp_path / "one.json"
    PolicyNet.init(1, (1, 2, 4), hidden=4).save(one)
    rt = group_runtime(batching=True, max_batch=4)
    rt.define_variant_group("det", {"full": 1.0, "fast": 0.5})
    with pytest.raises(InvalidParameterError, match="1 variant"):
        rt.set_batching(True, mode="qos_rl", policy=one)
    assert rt.stats()["batching"]["mode"] == "rafiqi"  # nothing changed
    rt.remove_variant_group("det")
    rt.set_batching(True, mode="qos_rl", policy=one)  # plain models: one variant fits
    with pytest.raises(InvalidParameterError, match="1 variant"):
        rt.define_variant_group("det", {"full": 1.0, "fast": 0.5})
    assert rt.variant_groups() == {}
    futs = [rt.submit("fast", x(i)) for i in range(10)]
    rt.device.run()
    assert all(f.result().model == "fast" for f in futs)
    assert rt.stats()["batching"]["deciders"]["fast"]["mode"] == "qos_rl"
    rt.close()


def test_mask_keeps_only_actions_the_unit_has() -> None:
    net = PolicyNet.init(2, (1, 2, 4, 8), hidden=4)
    view = BatchView(0.0, [(1.0, 2.0)] * 3, (1, 2, 4), (1.0,), lambda v, b: 0.001)
    ok = {a for a, m in zip(net.actions, net.mask(view)) if m}
    assert ok == {(0, 1), (0, 2), (0, 4)}  # one variant; 8 is not compiled
    x_ = net.features(view, rate=1000.0)
    assert x_.shape == (net.n_features,)
    assert x_[: net.n_pre + net.n_post].sum() == pytest.approx(3 / 32)


def test_tiny_training_is_reproducible() -> None:
    w = Workload(size=32, hour_s=0.25)
    # episodes of 0.02 trace hours (small_config's 0.05 cost 40% more): reproducibility
    # does not depend on the length
    a = train(w, small_config(seed=5, job_hours=0.02))
    b = train(w, small_config(seed=5, job_hours=0.02))
    np.testing.assert_array_equal(a.w1, b.w1)
    np.testing.assert_array_equal(a.w2, b.w2)
    assert len(a.meta["episode_mean_utility"]) == 2


def test_cli_eval_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("# ms offsets\n" + "\n".join(f"{i * 0.02:.3f}" for i in range(300)))
    rc = main(["qos", "eval", "--trace", str(trace), "--json", "-", "--quiet",
               "--hour-s", "0.25"])
    assert rc == 0
    out = capsys.readouterr().out
    res = json.loads(out)
    assert set(res["schedulers"]) == {"fixed", "heuristic", "rl"}
    for row in res["schedulers"].values():
        assert {"mean_utility", "sd_utility", "p_fast", "misses", "drops"} <= set(row)
        assert row["requests"] == 300 and 0.0 <= row["mean_utility"] <= 1.0
    assert main(["qos", "eval", "--trace", str(tmp_path / "none"), "--quiet"]) == 2
