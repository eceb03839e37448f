"""Input shapes given on a command line (``--input-shape``), parsed once for every CLI.

Why here and not in ``av_infer.cli``: the top-level CLI and the bench CLI both take the
option, and the bench CLI is imported by the top-level one; a shared parser below both
keeps the import graph free of circles.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["parse_input_shapes"]


def parse_input_shapes(values: Sequence[str] | None) -> dict[str, list[int]] | list[int] | None:
    """``1,3,320,320`` (single-input model) or ``name=1,3,320,320`` per input."""
    if not values:
        return None
    named: dict[str, list[int]] = {}
    for v in values:
        name, sep, dims = v.rpartition("=")
        try:
            shape = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise SystemExit(f"--input-shape: not a list of integers: {v!r}") from None
        if not sep:
            if len(values) > 1:
                raise SystemExit("--input-shape: use NAME=DIMS when giving several shapes")
            return shape
        named[name] = shape
    return named
