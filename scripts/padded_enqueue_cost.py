"""Host cost of CudaDevice.enqueue_padded next to a plain one-kernel enqueue: the Python
and Cython work a padded launch adds on the RT launch path (module lookup, the padded
argument struct, Dispatcher.set_padded, the vHQ push). The device is not started, so no
kernel runs and nothing competes for the CPU; the emulator only stands in for the driver
at load time, and this host code is the GPU's.

    .venv/bin/python scripts/padded_enqueue_cost.py     # prints JSON
"""

from __future__ import annotations

import json
import time

from av_infer.bench.metrics import pct
from av_infer.devices.cuda import CudaDevice
from av_infer.kernels.cuda.samples import chain_plan


def main(n: int = 20000) -> dict:
    dev = CudaDevice(emulate=True, c=4)
    try:
        rt_plan, _ = chain_plan(seed=1)
        be_plan, _ = chain_plan(seed=2)
        rt_h, be_h = dev.load_plan(rt_plan), dev.load_plan(be_plan)
        dev.prepare_padding([rt_h, be_h])
        s = dev.open_stream(1)
        dev.new_task(be_h, 0)
        dev.new_task(rt_h, 1)
        padded, plain = [], []
        clock = time.perf_counter
        for _ in range(n):
            t0 = clock()
            dev.enqueue_padded(s, 1, 0, [(0, 2, 0, 4, 1)])  # RT conv + 4 blocks of a BE conv
            t1 = clock()
            dev.reset(s)  # empties the vHQ (and drops the padded launch)
            t2 = clock()
            dev.enqueue(s, 1, 0, 0)
            t3 = clock()
            dev.reset(s)
            padded.append((t1 - t0) * 1e6)
            plain.append((t3 - t2) * 1e6)
    finally:
        dev.close()
    return {"calls": n,
            "enqueue_padded_us": {"p50": pct(padded, 50), "p99": pct(padded, 99)},
            "enqueue_one_kernel_us": {"p50": pct(plain, 50), "p99": pct(plain, 99)}}


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
