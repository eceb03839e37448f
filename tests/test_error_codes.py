"""Typed errors cross process boundaries by their stable ``code`` (InferResponse, the
pipeline's stage replies): every code names one class, and ``error_from_code`` rebuilds it."""

from __future__ import annotations

import av_infer.pipeline  # noqa: F401 - registers the pipeline's error classes
from av_infer import AvInferError, DeadlineMissedError, error_from_code


def _classes() -> list[type[AvInferError]]:
    out, todo = [], [AvInferError]
    while todo:
        cls = todo.pop(0)
        if cls not in out:
            out.append(cls)
            todo.extend(cls.__subclasses__())
    return out


def _owner(code: str) -> type[AvInferError]:
    """The most general class stating ``code`` (what ``error_from_code`` rebuilds)."""
    return next(c for c in _classes() if c.__dict__.get("code") == code)


def test_every_code_names_one_class_or_its_refinements():
    """A subclass may restate its parent's code (a more specific cause of the same
    answer, e.g. ``InputShapeError`` is an ``invalid_input``), never take another's."""
    for cls in _classes():
        code = cls.__dict__.get("code")
        if code is not None:
            assert issubclass(cls, _owner(code)), (cls, code, _owner(code))


def test_error_from_code_rebuilds_the_class_with_the_message():
    for cls in _classes():
        code = cls.__dict__.get("code")
        if code is None:
            continue
        err = error_from_code(code, "what was wrong")
        assert err.code == code and str(err) == "what was wrong"
        assert isinstance(err, AvInferError)
        if cls.__name__ != "UnsupportedModelError":  # needs its operator table
            assert type(err) is _owner(code)
    e = error_from_code("deadline_missed", "late")
    assert isinstance(e, DeadlineMissedError)


def test_an_unknown_code_is_kept_on_the_base_error():
    err = error_from_code("from_a_newer_peer", "m")
    assert type(err) is AvInferError and err.code == "from_a_newer_peer"
