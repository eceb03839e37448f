"""Host cost of CudaDevice.enqueue_padded (the Python + Cython work on the RT launch path)
next to a plain one-kernel enqueue in the same position (first launch of a new task, the
dispatcher thread idle, so both include waking it), on the CPU emulator: this host code
is the GPU's, only the kernels run elsewhere.

    .venv/bin/python scripts/padded_enqueue_cost.py     # prints JSON
"""

from __future__ import annotations

import json
import queue
import time

from av_infer.devices.cuda import CudaDevice
from av_infer.kernels.cuda.samples import chain_plan


def main(n: int = 2000) -> dict:
    dev = CudaDevice(emulate=True, c=4)
    done: queue.Queue = queue.Queue()
    dev.start(done.put)
    rt_plan, x = chain_plan(seed=1)
    be_plan, xb = chain_plan(seed=2)
    rt_h, be_h = dev.load_plan(rt_plan), dev.load_plan(be_plan)
    dev.prepare_padding([rt_h, be_h])
    s = dev.open_stream(1)
    dev.set_stream_capacity(s, 1)
    dev.new_task(be_h, 0)
    dev.write_inputs(0, xb)
    plain, padded = [], []
    for i in range(n):  # alternate: kernel 0 padded, or kernel 0 as a plain range
        t = 1 + i
        dev.new_task(rt_h, t)
        dev.write_inputs(t, x)
        t0 = time.perf_counter()
        if i % 2:
            dev.enqueue_padded(s, t, 0, [(0, 2, 0, 4, 1)])
            padded.append((time.perf_counter() - t0) * 1e6)
        else:
            dev.enqueue(s, t, 0, 0)
            plain.append((time.perf_counter() - t0) * 1e6)
        dev.enqueue(s, t, 1, len(rt_plan.kernels) - 1)
        while True:
            c = done.get(timeout=60)
            if c.task == t and c.kernel == len(rt_plan.kernels) - 1:
                break
        dev.release_task(t)
    dev.close()
    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[int(q * (len(xs) - 1))]

    return {"calls": n, "enqueue_padded_us": {"p50": pct(padded, 0.5), "p99": pct(padded, 0.99)},
            "enqueue_one_kernel_us": {"p50": pct(plain, 0.5), "p99": pct(plain, 0.99)}}


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
