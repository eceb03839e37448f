"""Real exporter output (PyTorch legacy exporter, opsets 13 and 17) compiles and matches ORT.

The fixtures in tests/fixtures/torch were made by scripts/export_torch_fixtures.py; each
.npz holds the inputs it was exported with.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from av_infer.kernels.cpu import CpuPlanRunner
from av_infer.model.check import CPU_TOLERANCE, max_rel_err, ort_session
from av_infer.model.compiler import compile_model

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "torch"


@pytest.mark.parametrize("optimize", [True, False], ids=["opt", "noopt"])
@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.onnx")), ids=lambda p: p.stem)
def test_exported_model_matches_ort(path: pathlib.Path, optimize: bool) -> None:
    data = np.load(path.with_suffix(".npz"))
    sess = ort_session(path, threads=1)
    feed = {i.name: data[i.name] for i in sess.get_inputs()}
    shapes = {k: v.shape for k, v in feed.items()}
    plan = compile_model(path, input_shapes=shapes, optimize=optimize)
    got = CpuPlanRunner(plan).run(feed)
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    for name, ref in want.items():
        assert max_rel_err(got[name], ref) <= CPU_TOLERANCE, name


def test_dynamic_batch_export_binds_batch() -> None:
    path = FIXTURES / "tiny_resnet_dynbatch_opset17.onnx"
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    plan = compile_model(path, input_shapes=[3, 3, 32, 32])
    sess = ort_session(path, threads=1)
    name = sess.get_inputs()[0].name
    want = sess.run(None, {name: x})[0]
    got = CpuPlanRunner(plan).run({name: x})
    assert max_rel_err(got[plan.outputs[0]], want) <= CPU_TOLERANCE
