"""When two measured cells of one block count as equal, and how the block profiler
(:mod:`.block_measure`) turns a row that is non-monotone only within the measurement's
noise into the monotone row the planner and the data plane rely on.

Why monotone: the data plane (:mod:`.batcher`) takes the *largest* batch whose probed
finish meets the oldest deadline, scanning down from the unified batch, and times a
partial batch as the smallest profiled batch that holds it; both are right only when a
block never takes longer at a smaller batch. A block that is per-call overhead only
(tiny_cnn's last block: 7.8 / 7.5 / 7.7 us at batch 1 / 2 / 4) is *flat*, so any load on
the host while one of its cells is timed makes that row non-monotone.

The noise of a difference (``allowed_drop_us``) is the largest of

* ``tolerance`` (:data:`~.profile_files.MONOTONE_TOLERANCE`, 10 %) of the smaller batch's
  cell: the relative rule the file loader applies too;
* :data:`NOISE_FLOOR_US`, an absolute floor (below);
* the two cells' own spread, :meth:`Cell.noise_us`: ``NOISE_MADS`` median absolute
  deviations of a cell's timed repeats (the largest seen over its timings), or the range of
  its medians over its re-timings, whichever is larger: two timings of the same cell
  that disagree by ``r`` show that the host moves that cell by ``r``.

The floor. On this project's VM (2 shared vCPUs, several agents) a whole cell of a few
tens of microseconds is at times stretched 2-2.5x for milliseconds: 2000 timings of
tiny_cnn's last block (7 repeats each) measured medians of 20-25 us against 8 us with the
repeats' MAD under 1 us, and after the minimum over 4 timings the drop between adjacent
batches of that flat block still reached 12-14 us (the maximum over about 4000 rows; p99
4-10 us; ``docs/pipeline.md``, "Timing noise"). The repeats' MAD cannot see such a stretch (every
repeat of the cell is stretched alike) and re-timing only removes it when the next timing
is not stretched too. So differences under ``NOISE_FLOOR_US`` are not taken as evidence
of anything: a block would have to be faster at a larger batch by more than that (and
than 10 % and its spread) to be refused. ``perf_counter`` resolves 1 ns, far below it.

What is made of a row within the noise: each cell is raised to the running maximum over
the smaller batches (never lowered: the planner then never counts a batch as cheaper
than it measured), and every raised cell is listed (:func:`monotone`) so that the
profiler records it in the file's provenance (``monotone_adjusted``). A row with a drop
beyond the noise after ``retimings`` re-timings is refused with
:class:`~.errors.NonMonotoneProfileError`, as before.

Everything here is pure: the timings come from a callable, so tests inject them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from av_infer.pipeline.errors import NonMonotoneProfileError
from av_infer.pipeline.profile_files import MONOTONE_TOLERANCE

#: differences between two cells of one block below this many microseconds are noise
#: (see the module docstring for the measurements behind it)
NOISE_FLOOR_US = 15.0
#: a cell's spread is this many MADs of its repeats (about 2 standard deviations for
#: normal noise: 1 MAD ~ 0.67 sigma)
NOISE_MADS = 3.0
#: re-timings of a row before a drop beyond the noise is refused
RETIMINGS = 3


@dataclass(frozen=True)
class Timing:
    """One timing of one cell: the median of its repeats and their median absolute
    deviation, in microseconds."""

    median_us: float
    mad_us: float

    @classmethod
    def of(cls, samples_us: Sequence[float]) -> Timing:
        """The timing of ``samples_us`` (one or more timed runs, microseconds)."""
        med = float(statistics.median(samples_us))
        return cls(med, float(statistics.median(abs(x - med) for x in samples_us)))


@dataclass
class Cell:
    """One (block, batch) cell over all its timings: the smallest median is its value
    (load only ever adds time), the largest MAD and the range of medians its spread."""

    us: float
    mad_us: float
    hi_us: float

    @classmethod
    def first(cls, t: Timing) -> Cell:
        return cls(t.median_us, t.mad_us, t.median_us)

    def add(self, t: Timing) -> None:
        """Fold in a re-timing."""
        self.us = min(self.us, t.median_us)
        self.hi_us = max(self.hi_us, t.median_us)
        self.mad_us = max(self.mad_us, t.mad_us)

    @property
    def noise_us(self) -> float:
        """This cell's own spread: ``NOISE_MADS`` MADs, or the range of its medians."""
        return max(NOISE_MADS * self.mad_us, self.hi_us - self.us)


def allowed_drop_us(small: Cell, large: Cell, tolerance: float = MONOTONE_TOLERANCE,
                    floor_us: float = NOISE_FLOOR_US) -> float:
    """How much faster the cell at a larger batch (``large``) may measure than the one at
    a smaller batch (``small``) and still count as equal to it."""
    return max(tolerance * small.us, floor_us, small.noise_us + large.noise_us)


@dataclass(frozen=True)
class Drop:
    """A cell measured faster than a smaller batch's: by ``drop_us``, ``allowed_us`` of
    which the noise covers."""

    batch_small: int
    batch_large: int
    small_us: float
    large_us: float
    drop_us: float
    allowed_us: float

    @property
    def within_noise(self) -> bool:
        return self.drop_us <= self.allowed_us


def drops(cells: dict[int, Cell], tolerance: float = MONOTONE_TOLERANCE,
          floor_us: float = NOISE_FLOOR_US) -> list[Drop]:
    """Every cell below the running maximum of the smaller batches' cells (ascending
    batches): a cell is compared with the cell it would be raised to, so small drops
    cannot add up unchecked over several batches."""
    out: list[Drop] = []
    top: tuple[int, Cell] | None = None
    for b in sorted(cells):
        c = cells[b]
        if top is not None and c.us < top[1].us:
            out.append(Drop(top[0], b, top[1].us, c.us, top[1].us - c.us,
                            allowed_drop_us(top[1], c, tolerance, floor_us)))
        if top is None or c.us >= top[1].us:
            top = (b, c)
    return out


def monotone(cells: dict[int, Cell]) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """The row made monotone by a running maximum over ascending batches, and each raised
    cell as ``{"batch", "measured_us", "written_us", "from_batch"}``. Call it on a row
    whose :func:`drops` are all within the noise."""
    row: dict[int, float] = {}
    raised: list[dict[str, Any]] = []
    top_b, top = 0, float("-inf")
    for b in sorted(cells):
        x = cells[b].us
        if x < top:
            raised.append({"batch": b, "measured_us": round(x, 3),
                           "written_us": round(top, 3), "from_batch": top_b})
            x = top
        else:
            top_b, top = b, x
        row[b] = x
    return row, raised


def settle_row(time_cell: Callable[[int], Timing | None], batches: Sequence[int], *,
               where: str, retimings: int = RETIMINGS,
               tolerance: float = MONOTONE_TOLERANCE, floor_us: float = NOISE_FLOOR_US
               ) -> tuple[dict[int, float], list[dict[str, Any]]]:
    """Time one block at ``batches`` (``time_cell(b)``: a timing, or None where batch
    ``b`` cannot run: left out), re-time the whole row while a drop is beyond the noise
    (at most ``retimings`` times, folding each re-timing into the cells) and return the
    monotone row with its raised cells (:func:`monotone`).

    Raises NonMonotoneProfileError when a drop beyond the noise survives the re-timings."""
    cells: dict[int, Cell] = {}
    for b in batches:
        t = time_cell(b)
        if t is not None:
            cells[b] = Cell.first(t)
    for attempt in range(retimings + 1):
        bad = [d for d in drops(cells, tolerance, floor_us) if not d.within_noise]
        if not bad:
            return monotone(cells)
        if attempt == retimings:
            d = max(bad, key=lambda d: d.drop_us - d.allowed_us)
            raise NonMonotoneProfileError(
                f"{where}: {d.large_us:.1f} us at batch {d.batch_large} is {d.drop_us:.1f} us "
                f"faster than {d.small_us:.1f} us at batch {d.batch_small} after "
                f"{retimings} re-timings, beyond the measurement's noise ({d.allowed_us:.1f} "
                f"us: the largest of {tolerance:.0%}, the {floor_us:g} us floor and the "
                "cells' spread); a block this much faster at a larger batch is not "
                "timing noise, or the host is too noisy to profile on")
        for b, c in cells.items():
            t = time_cell(b)
            if t is not None:
                c.add(t)
    raise AssertionError("unreachable")  # the last attempt returns or raises
