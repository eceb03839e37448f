"""``ArgTemplate``: a task's argument structs from one template per loaded plan are the
bytes ``LaunchSpec.pack`` gives for that task (every zoo model, the kernel samples, random
arena bases), and the cuda device's tasks use them (emulator)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from av_infer.kernels.cuda.samples import chain_plan, samples
from av_infer.kernels.cuda.sources import ArgTemplate, build_plan_source, slot_address
from tests.checks import require


def _plans() -> list:
    from av_infer.model import zoo
    from av_infer.model.compiler import compile_model

    plans = [p for p, _ in samples().values()] + [chain_plan()[0]]
    for name in ("tiny_cnn", "tiny_mlp", "resnet152", "densenet201", "inception_v3",
                 "distilbert"):
        plans.append(compile_model(zoo.path(name, "scaled"), name=name))
    return plans


@pytest.mark.parametrize("seed", [0, 1])
def test_template_bytes_equal_packing_every_spec(seed):
    rnd = random.Random(seed)
    for plan in _plans():
        src = build_plan_source(plan)
        weights = rnd.randrange(1 << 20, 1 << 44) * 256
        aux = [rnd.randrange(1 << 20, 1 << 44) * 256 for _ in src.aux]
        tmpl = ArgTemplate.build(plan, src.specs, weights, aux)
        for _ in range(3):
            arena = rnd.randrange(1 << 20, 1 << 44) * 256
            want, offs, pos = [], [], 0
            for s in src.specs:
                b = s.pack(lambda ref, p=plan, w=weights, a=arena, x=aux:
                           slot_address(p, ref, w, a, x))
                want.append(b)
                offs.append(pos)
                pos += len(b)
            assert tmpl.for_arena(arena) == b"".join(want), plan.name
            assert list(tmpl.offs) == offs
        # the template is not changed by making a task's bytes
        assert tmpl.for_arena(0) == tmpl.words.tobytes()
        assert tmpl.words.dtype == np.uint64


def test_device_tasks_run_from_the_template_on_the_emulator():
    """Two tasks of one model get different arenas and both answer as ONNX Runtime does
    (the struct bytes they were registered with come from the template)."""
    from av_infer.devices.cuda import CudaDevice, availability

    ok, why = availability(emulate=True)
    require("ok" if ok else None, f"the CUDA emulator cannot run: {why}")
    import onnxruntime as ort

    from av_infer.model import zoo
    from av_infer.runtime import Runtime

    path = zoo.path("tiny_cnn", "scaled")
    x = zoo.sample_inputs("tiny_cnn", "scaled")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, x)
    with Runtime(device=CudaDevice(emulate=True)) as rt:
        rt.load_model("m", path)
        futs = [rt.submit("m", x, priority="be") for _ in range(3)]
        for f in futs:
            got = list(f.result().outputs.values())
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)
