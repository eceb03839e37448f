"""Adaptive batching of best-effort work (Rafiqi §3.3).

Why: under heavy BE load one task per request wastes the device on launch overheads and
small kernels; a fixed batch size either adds latency at low load or throttles throughput
at high load. Rafiqi's threshold ``t`` follows the load per model and per quantum
(default 5 ms): it **falls fast** (``t = max(1, t/2)`` when fewer than ``t`` requests
arrived in the last quantum) and **rises slowly** (``t = α·t + (1-α)·c`` otherwise, α = 0.5,
``c`` the arrivals of that quantum), capped by the largest compiled batch size.

Unlike Rafiqi, nothing ever *waits* for a batch to fill: :meth:`AdaptiveBatcher.take`
batches what is already queued (work-conserving), so low load costs no latency. RT work
is never batched (it would wait on, or be slowed by, its batch-mates).

Plans are compiled for a few batch sizes (e.g. 1, 2, 4, 8); ``take`` returns the largest
compiled size not above ``min(t, queued)``. :func:`stack_inputs` and
:func:`split_outputs` turn single requests into one batched task and back, so batched
requests are still answered individually.

:class:`Eq2Batcher` is the other mode (seed paper 001 §3.1, eq. 2): the smallest compiled
batch size ``B >= [α·D_B·R_t + (1-α)·N_t]·β`` (``R_t`` arrivals per second in a sliding
window, ``N_t`` queued requests, ``D_B`` the expected device time of a batch of B): just
enough to keep up with arrivals, so batches stay small (low delay) until the load needs
them large. The runtime selects either mode (``Runtime(batch_mode=...)``); which variant
of a group runs the batch is chosen by utility (``av_infer.qos.deciders``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from av_infer.errors import InvalidInputError, InvalidParameterError

DEFAULT_BATCH_SIZES = (1, 2, 4, 8)

#: Quanta processed one by one when a lazy update catches up; beyond this t is 1 anyway.
_MAX_CATCHUP = 64


class AdaptiveBatcher:
    """The adaptive threshold of one BE model; see the module docstring.

    Time is whatever clock the caller uses (device time, virtual in the simulator); the
    batcher is updated lazily by ``observe_arrival``/``take``/``tick`` and keeps no thread.
    Not thread-safe: the scheduler calls it from its own thread.
    """

    def __init__(
        self,
        batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES,
        quantum: float = 0.005,
        alpha: float = 0.5,
        start: float = 0.0,
    ) -> None:
        sizes = sorted({int(b) for b in batch_sizes})
        if not sizes or sizes[0] < 1:
            raise InvalidParameterError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
        if 1 not in sizes:
            sizes.insert(0, 1)  # a lone request must always be servable
        if not quantum > 0:
            raise InvalidParameterError(f"batching quantum must be > 0 s, got {quantum}")
        if not 0.0 <= alpha < 1.0:
            raise InvalidParameterError(f"batching alpha must be in [0, 1), got {alpha}")
        self.batch_sizes: tuple[int, ...] = tuple(sizes)
        self.quantum = float(quantum)
        self.alpha = float(alpha)
        self.threshold = 1.0
        self._q_start = float(start)  # start of the current quantum
        self._count = 0  # arrivals in the current quantum
        self.quanta = 0  # quanta closed so far (diagnostics)
        self.batches: dict[int, int] = {}  # batch size -> times taken (diagnostics)

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def set_batch_sizes(self, batch_sizes: Iterable[int]) -> None:
        """Change the compiled sizes (the cap follows; t is clamped to it)."""
        sizes = sorted({int(b) for b in batch_sizes} | {1})
        if sizes[0] < 1:
            raise InvalidParameterError(f"batch sizes must be >= 1, got {sizes}")
        self.batch_sizes = tuple(sizes)
        self.threshold = min(self.threshold, float(self.max_batch))

    def _close_quantum(self, c: int) -> None:
        t = self.threshold
        if c < t:
            t = max(1.0, t / 2.0)
        else:
            t = self.alpha * t + (1.0 - self.alpha) * c
        self.threshold = min(t, float(self.max_batch))
        self.quanta += 1

    def tick(self, now: float) -> float:
        """Close every quantum that ended by ``now``; returns the threshold."""
        elapsed = int((now - self._q_start) // self.quantum)
        if elapsed <= 0:
            return self.threshold
        self._close_quantum(self._count)
        self._count = 0
        # quanta with no arrivals at all: each halves t (bounded catch-up)
        for _ in range(min(elapsed - 1, _MAX_CATCHUP)):
            if self.threshold <= 1.0:
                break
            self._close_quantum(0)
        self._q_start += elapsed * self.quantum
        return self.threshold

    def observe_arrival(self, now: float, n: int = 1) -> None:
        """Count ``n`` requests arriving at ``now``."""
        self.tick(now)
        self._count += int(n)

    def size_for(self, n: int) -> int:
        """Largest compiled batch size <= n (>= 1)."""
        best = 1
        for b in self.batch_sizes:
            if b <= n:
                best = b
        return best

    def take(self, queue_len: int, now: float) -> int:
        """How many queued requests to run now as one batch (0 if none are queued)."""
        if queue_len <= 0:
            return 0
        t = self.tick(now)
        b = self.size_for(min(math.floor(t + 1e-9), int(queue_len)))
        self.batches[b] = self.batches.get(b, 0) + 1
        return b

    def stats(self) -> dict[str, object]:
        return {
            "threshold": self.threshold,
            "batch_sizes": list(self.batch_sizes),
            "quanta": self.quanta,
            "batches": dict(sorted(self.batches.items())),
        }


class RateWindow:
    """Arrival rate over a sliding window of ``window`` seconds (the paper's R_t)."""

    __slots__ = ("window", "_times")

    def __init__(self, window: float) -> None:
        if not window > 0:
            raise InvalidParameterError(f"rate window must be > 0 s, got {window}")
        self.window = float(window)
        self._times: deque[float] = deque()

    def observe(self, now: float, n: int = 1) -> None:
        self._times.extend([now] * int(n))
        self._prune(now)

    def _prune(self, now: float) -> None:
        times, lo = self._times, now - self.window
        while times and times[0] <= lo:
            times.popleft()

    def rate(self, now: float) -> float:
        """Arrivals per second over the last window."""
        self._prune(now)
        return len(self._times) / self.window


class Eq2Batcher:
    """Paper 001 eq. 2 batch sizes for one model or variant group (module docstring).

    ``alpha`` in [0, 1] weighs predicted arrivals against the queue; ``beta`` > 0 scales
    the whole target (the paper tunes both on training data). Not thread-safe: the
    scheduler calls it from its driver.
    """

    def __init__(self, batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES, alpha: float = 0.5,
                 beta: float = 1.0, window: float = 0.05) -> None:
        sizes = sorted({int(b) for b in batch_sizes} | {1})
        if sizes[0] < 1:
            raise InvalidParameterError(f"batch sizes must be >= 1, got {sizes}")
        if not 0.0 <= alpha <= 1.0:
            raise InvalidParameterError(f"eq. 2 alpha must be in [0, 1], got {alpha}")
        if not beta > 0:
            raise InvalidParameterError(f"eq. 2 beta must be > 0, got {beta}")
        self.batch_sizes: tuple[int, ...] = tuple(sizes)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.rates = RateWindow(window)
        self.batches: dict[int, int] = {}  # batch size -> times chosen (diagnostics)

    def set_batch_sizes(self, batch_sizes: Iterable[int]) -> None:
        self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes} | {1}))

    def observe_arrival(self, now: float, n: int = 1) -> None:
        self.rates.observe(now, n)

    def target(self, queued: int, now: float, d_of: Callable[[int], float]) -> int:
        """The smallest compiled B satisfying eq. 2 (the largest if none does)."""
        r = self.rates.rate(now)
        a, beta = self.alpha, self.beta
        for b in self.batch_sizes:
            if b >= (a * d_of(b) * r + (1.0 - a) * queued) * beta:
                return b
        return self.batch_sizes[-1]

    def take(self, queued: int, now: float, d_of: Callable[[int], float]) -> int:
        """How many of ``queued`` requests to run now (0 if none): eq. 2's B, at most the
        queue (the plan chosen for it may be larger and padded)."""
        if queued <= 0:
            return 0
        n = min(self.target(queued, now, d_of), queued)
        self.batches[n] = self.batches.get(n, 0) + 1
        return n

    def stats(self) -> dict[str, object]:
        return {"alpha": self.alpha, "beta": self.beta, "window_s": self.rates.window,
                "batch_sizes": list(self.batch_sizes),
                "batches": dict(sorted(self.batches.items()))}


def stack_inputs(
    inputs: Sequence[Mapping[str, np.ndarray]], batch: int
) -> dict[str, np.ndarray]:
    """Concatenate per-request inputs along axis 0 and pad with zero rows to ``batch``.

    Every request must give the same input names, dtypes and trailing dims.
    """
    if not inputs:
        raise InvalidInputError("stack_inputs needs at least one request")
    names = list(inputs[0])
    out: dict[str, np.ndarray] = {}
    for name in names:
        parts = []
        for i, d in enumerate(inputs):
            if name not in d:
                raise InvalidInputError(f"request {i} of the batch lacks input {name!r}")
            a = np.asarray(d[name])
            if a.ndim == 0:
                raise InvalidInputError(f"input {name!r} has no batch dimension")
            parts.append(a)
        rows = sum(p.shape[0] for p in parts)
        if rows > batch:
            raise InvalidInputError(f"{rows} rows of {name!r} exceed the batch size {batch}")
        tail, dt = parts[0].shape[1:], parts[0].dtype
        for i, p in enumerate(parts):
            if p.shape[1:] != tail or p.dtype != dt:
                raise InvalidInputError(
                    f"input {name!r} of request {i} is {p.dtype}{list(p.shape)}, "
                    f"request 0 gave {dt}{list(parts[0].shape)}"
                )
        if rows < batch:
            parts.append(np.zeros((batch - rows, *tail), dtype=dt))
        out[name] = np.concatenate(parts, axis=0)
    return out


def split_outputs(
    outputs: Mapping[str, np.ndarray], n: int, sizes: Sequence[int] | None = None
) -> list[dict[str, np.ndarray]]:
    """Split batched outputs along axis 0 back into ``n`` requests' outputs (fresh arrays).

    ``sizes`` gives each request's rows (default 1 each); padding rows are dropped.
    """
    sizes = [1] * n if sizes is None else [int(s) for s in sizes]
    if len(sizes) != n:
        raise InvalidParameterError(f"{len(sizes)} sizes given for {n} requests")
    total = sum(sizes)
    res: list[dict[str, np.ndarray]] = [{} for _ in range(n)]
    for name, a in outputs.items():
        a = np.asarray(a)
        if a.ndim == 0 or a.shape[0] < total:
            raise InvalidParameterError(
                f"output {name!r} of shape {list(a.shape)} has fewer than {total} batch rows"
            )
        off = 0
        for i, s in enumerate(sizes):
            res[i][name] = a[off:off + s].copy()
            off += s
    return res
