"""Measured block profiles as files: the planner's first-class input (issue 32, PPipe §5.2).

One JSON file per (model, device type) holds what PPipe's MILP reads (docs/pipeline.md,
"Measured profiles"): the latency of each pre-partitioned block on ``1/v`` of one device
at each batch size *that was measured at that fraction*, and the bytes that cross each cut
between blocks at batch 1. A batch size missing from a fraction's list means "not
measured" and the planner never uses that (fraction, batch) cell; no sentinel exists,
and ``inf``/``NaN`` are refused (``inf - inf`` is NaN in prefix sums).

:class:`MeasuredProfile` is the in-memory form; it answers the questions the planner and
the data plane ask of :class:`av_infer.profiles.BlockProfile` (``latency(v, b)``,
``vfracs``, ``batches``, ``out_bytes``, ``blocks``) plus :meth:`MeasuredProfile.batches_at`,
so both kinds plan alike. :func:`load_profiles` reads a directory and checks everything
at the boundary, raising the typed errors of :mod:`.errors`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from av_infer.pipeline.errors import (
    MissingCellError,
    NonMonotoneProfileError,
    ProfileFormatError,
    ProfileUnitsError,
)

FORMAT = "av_infer.block_profile"
FORMAT_VERSION = 1
#: a file in a profiles directory
SUFFIX = ".blocks.json"
LATENCY_UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}
BYTES_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2}
#: a block may measure up to this much faster at a larger batch (timing noise) before the
#: loader calls the data non-monotone (the profiler's own rule, wider and with a running
#: max, is :mod:`.profile_noise`'s)
MONOTONE_TOLERANCE = 0.10
SOURCES = ("measured", "derived")


@dataclass
class MeasuredProfile:
    """Block latencies (us) of one model on one device type, per fraction and batch.

    ``table[v][b]``: the ``n_blocks`` latencies on ``1/v`` of one device at batch ``b``;
    only measured cells exist. ``cut_bytes[i]``: bytes crossing from block ``i`` to
    ``i + 1`` at batch 1 (``n_blocks - 1`` of them). ``source``: ``measured`` or
    ``derived`` (a roofline estimate: named so in every output). ``provenance``: how it
    was made (command, host, variant, statistic), kept verbatim.
    """

    model: str
    device_type: str
    source: str
    n_blocks: int
    cut_bytes: tuple[float, ...]
    table: dict[int, dict[int, tuple[float, ...]]]
    provenance: dict[str, Any] = field(default_factory=dict)

    # -- the BlockProfile questions ---------------------------------------------------
    @property
    def device(self) -> str:
        return self.device_type

    @property
    def variant(self) -> str:
        return str(self.provenance.get("variant", ""))

    @property
    def vfracs(self) -> list[int]:
        return sorted(self.table)

    @property
    def batches(self) -> list[int]:
        """Every batch size measured at some fraction (see :meth:`batches_at`)."""
        return sorted({b for row in self.table.values() for b in row})

    def batches_at(self, v: int) -> list[int]:
        """Batch sizes measured on ``1/v`` of a device (empty if ``v`` was not)."""
        return sorted(self.table.get(int(v), {}))

    @property
    def blocks(self) -> list[list[int]]:
        return [[i, i + 1] for i in range(self.n_blocks)]

    @property
    def out_bytes(self) -> list[float]:
        """Bytes leaving each block (the last: 0, the model's output is not handed on)."""
        return [*self.cut_bytes, 0.0]

    def latency(self, v: int, batch: int) -> list[float]:
        """Per-block latencies (us); KeyError for a cell that was not measured."""
        return list(self.table[int(v)][int(batch)])

    # -- the file -----------------------------------------------------------------------
    def to_doc(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": FORMAT_VERSION, "model": self.model,
            "device_type": self.device_type, "source": self.source,
            "latency_unit": "us", "bytes_unit": "B", "n_blocks": self.n_blocks,
            "cut_bytes": [float(x) for x in self.cut_bytes],
            "fractions": {str(v): {"batches": sorted(rows),
                                   "latency": [[round(x, 3) for x in rows[b]]
                                               for b in sorted(rows)]}
                          for v, rows in sorted(self.table.items())},
            "provenance": self.provenance,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        from av_infer.profiles import atomic_write_text

        text = json.dumps(self.to_doc(), indent=1)
        # one line per list of numbers (a latency row, the cut bytes): readable diffs
        text = re.sub(r"\[\s+([-+0-9.eE,\s]+?)\s+\]",
                      lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
        atomic_write_text(path, text + "\n")

    def file_name(self) -> str:
        return f"{self.model}.{self.device_type}{SUFFIX}"


def from_block_profile(bp: Any) -> MeasuredProfile:
    """The :class:`MeasuredProfile` of a stored :class:`av_infer.profiles.BlockProfile`
    (one batch list for every fraction)."""
    table = {int(v): {int(b): tuple(float(x) for x in row)
                      for b, row in zip(bp.batches, rows)}
             for v, rows in bp.latency_us.items()}
    return MeasuredProfile(bp.model, bp.device, bp.source, len(bp.blocks),
                           tuple(float(x) for x in bp.out_bytes[:-1]), table,
                           {"variant": bp.variant, "from": "av_infer.profiles.BlockProfile"})


def batches_at(profile: Any, v: int) -> list[int]:
    """Batch sizes of ``profile`` measured at fraction ``1/v`` (a BlockProfile has one
    list for every fraction)."""
    f = getattr(profile, "batches_at", None)
    if f is not None:
        return f(v)
    return list(profile.batches) if v in profile.vfracs else []


# -- checking a document ---------------------------------------------------------------


def _num(x: Any, what: str, where: str, *, positive: bool) -> float:
    if x is None:
        raise MissingCellError(f"{where}: {what} is null; leave an unmeasured batch out "
                               "of its fraction's batch list instead")
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ProfileFormatError(f"{where}: {what} must be a number, got {x!r}")
    v = float(x)
    if not math.isfinite(v):
        raise ProfileFormatError(f"{where}: {what} is {x!r}; inf/NaN are not measurements "
                                 "(leave the batch out of the fraction's list)")
    if v < 0 or (positive and v == 0):
        raise ProfileFormatError(f"{where}: {what} must be {'> 0' if positive else '>= 0'}, "
                                 f"got {x!r}")
    return v


def _int(x: Any, what: str, where: str, lo: int = 1) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < lo:
        raise ProfileFormatError(f"{where}: {what} must be an integer >= {lo}, got {x!r}")
    return x


def parse_profile(doc: Any, where: str = "profile",
                  tolerance: float = MONOTONE_TOLERANCE) -> MeasuredProfile:
    """Check ``doc`` (a parsed file) against the format and build the profile."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ProfileFormatError(f"{where}: not a block profile (need \"format\": "
                                 f"\"{FORMAT}\")")
    if doc.get("version") != FORMAT_VERSION:
        raise ProfileFormatError(f"{where}: version {doc.get('version')!r}; this reader "
                                 f"knows {FORMAT_VERSION}")
    for key in ("model", "device_type"):
        if not isinstance(doc.get(key), str) or not doc[key].strip():
            raise ProfileFormatError(f"{where}: {key!r} must be a non-empty string")
    source = doc.get("source", "measured")
    if source not in SOURCES:
        raise ProfileFormatError(f"{where}: source must be one of {SOURCES}, got {source!r}")
    lu, bu = doc.get("latency_unit"), doc.get("bytes_unit", "B")
    if lu not in LATENCY_UNITS:
        raise ProfileUnitsError(f"{where}: latency_unit {lu!r}; known: "
                                f"{', '.join(LATENCY_UNITS)}")
    if bu not in BYTES_UNITS:
        raise ProfileUnitsError(f"{where}: bytes_unit {bu!r}; known: {', '.join(BYTES_UNITS)}")
    lscale, bscale = LATENCY_UNITS[lu], BYTES_UNITS[bu]
    n = _int(doc.get("n_blocks"), "n_blocks", where)
    cuts = doc.get("cut_bytes")
    if not isinstance(cuts, list) or len(cuts) != n - 1:
        raise MissingCellError(f"{where}: cut_bytes must list the bytes of each of the "
                               f"{n - 1} cuts between {n} blocks, got {cuts!r}")
    cut_bytes = tuple(_num(c, f"cut_bytes[{i}]", where, positive=False) * bscale
                      for i, c in enumerate(cuts))
    fr = doc.get("fractions")
    if not isinstance(fr, dict) or not fr:
        raise MissingCellError(f"{where}: fractions must map '1', '2', ... to measured "
                               "batches; none given")
    table: dict[int, dict[int, tuple[float, ...]]] = {}
    for key, body in fr.items():
        try:
            v = int(key)
        except (TypeError, ValueError):
            v = 0
        if v < 1 or str(v) != str(key).strip():
            raise ProfileFormatError(f"{where}: fraction key {key!r} must be an integer v "
                                     ">= 1 (the device split v ways)")
        w = f"{where} fraction 1/{v}"
        if not isinstance(body, dict):
            raise ProfileFormatError(f"{w}: must be an object with batches and latency")
        bl, rows = body.get("batches"), body.get("latency")
        if not isinstance(bl, list) or not bl:
            raise MissingCellError(f"{w}: no batches (drop the fraction if unmeasured)")
        bs = [_int(b, "batch size", w) for b in bl]
        if any(b2 <= b1 for b1, b2 in zip(bs, bs[1:])):
            raise NonMonotoneProfileError(f"{w}: batches must be strictly increasing, got {bs}")
        if not isinstance(rows, list) or len(rows) != len(bs):
            raise MissingCellError(f"{w}: latency needs one row per batch ({len(bs)}), got "
                                   f"{len(rows) if isinstance(rows, list) else rows!r}")
        table[v] = {}
        for b, row in zip(bs, rows):
            if not isinstance(row, list) or len(row) != n:
                raise MissingCellError(f"{w} batch {b}: need {n} block latencies, got "
                                       f"{row!r}")
            table[v][b] = tuple(_num(x, f"block {i} latency", f"{w} batch {b}",
                                     positive=True) * lscale for i, x in enumerate(row))
        for b1, b2 in zip(bs, bs[1:]):
            for i, (x1, x2) in enumerate(zip(table[v][b1], table[v][b2])):
                if x2 < x1 * (1 - tolerance):
                    raise NonMonotoneProfileError(
                        f"{w}: block {i} takes {x2:g} us at batch {b2} but {x1:g} us at "
                        f"batch {b1} (more than {tolerance:.0%} faster with a larger batch)")
    prov = doc.get("provenance", {})
    if not isinstance(prov, dict):
        raise ProfileFormatError(f"{where}: provenance must be an object")
    return MeasuredProfile(doc["model"].strip(), doc["device_type"].strip().lower(), source,
                           n, cut_bytes, table, dict(prov))


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON document in ``path`` (profile and cluster files); ProfileFormatError when
    it cannot be read or is not JSON."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileFormatError(f"{p}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise ProfileFormatError(f"{p}: not JSON: {e}") from None


def load_profile(path: str | os.PathLike[str]) -> MeasuredProfile:
    return parse_profile(read_json(path), str(Path(path)))


def load_profiles(directory: str | os.PathLike[str], models: Sequence[str] | None = None
                  ) -> dict[str, dict[str, MeasuredProfile]]:
    """``{model: {device type: profile}}`` from every ``*.blocks.json`` in ``directory``
    (only ``models`` if given). Refuses duplicates and profiles of one model that
    disagree on blocks or cut bytes (the planner cuts every type at the same blocks)."""
    d = Path(directory)
    if not d.is_dir():
        raise ProfileFormatError(f"profiles directory {d} does not exist")
    out: dict[str, dict[str, MeasuredProfile]] = {}
    for f in sorted(d.glob(f"*{SUFFIX}")):
        prof = load_profile(f)
        if models is not None and prof.model not in models:
            continue
        by_type = out.setdefault(prof.model, {})
        if prof.device_type in by_type:
            raise ProfileFormatError(f"{f}: a second profile of {prof.model!r} on "
                                     f"{prof.device_type!r}")
        by_type[prof.device_type] = prof
    if models is not None:
        missing = [m for m in models if m not in out]
        if missing:
            raise MissingCellError(f"no profile in {d} for model(s) {missing}; found "
                                   f"{sorted(out)}")
    if not out:
        raise MissingCellError(f"no *{SUFFIX} block profiles in {d}")
    check_consistent(out)
    return out


def check_consistent(profiles: Mapping[str, Mapping[str, Any]]) -> None:
    """Every profile of one model has the same blocks and cut bytes (1 % tolerance)."""
    for m, by_type in profiles.items():
        items = list(by_type.items())
        t0, p0 = items[0]
        for t, p in items[1:]:
            if len(p.blocks) != len(p0.blocks):
                raise ProfileFormatError(
                    f"model {m!r}: {len(p0.blocks)} blocks on {t0!r} but {len(p.blocks)} "
                    f"on {t!r}; profile every type on the same pre-partitioning")
            for i, (a, b) in enumerate(zip(p0.out_bytes[:-1], p.out_bytes[:-1])):
                if abs(a - b) > 0.01 * max(a, b, 1.0):
                    raise ProfileFormatError(
                        f"model {m!r}: cut {i} crosses {a:g} B on {t0!r} but {b:g} B on "
                        f"{t!r}; the cuts must be the same")


def require_types(profiles: Mapping[str, Mapping[str, Any]], types: Sequence[str]) -> None:
    """Every model has a profile on every device type of the cluster (MissingCellError
    names the pairs): a missing file must not silently keep a model off a type."""
    missing = [f"{m}@{t}" for m, by_type in profiles.items() for t in types
               if t not in by_type]
    if missing:
        raise MissingCellError(f"no block profile for {', '.join(missing)}; profile these "
                               "(av-infer profile --blocks) or drop the type")
