"""Python modules that are also compiled, and whether their builds are current.

A module listed in ``PURE_MODULES`` is one ``.py`` source with a ``.pxd`` beside it that
gives its classes C fields and its hot methods C calls (Cython's pure-Python mode:
``av_infer/sched/scheduler.pxd``, ``driver.pxd``). ``setup.py`` builds each into an
extension next to the ``.py``; Python imports the extension first, and the ``.py`` runs
interpreted only where no build exists. So a build older than its source runs *old
code*: :func:`stale` says which, and the test suite refuses to start on one
(``tests/conftest.py``). ``setup.py`` reads ``PURE_MODULES`` from this file with
``runpy`` (the package cannot be imported before it is built); this file imports
nothing of av_infer.

``AV_INFER_INTERPRETED=1`` runs the listed modules from their ``.py`` even where a build
exists (``av_infer/__init__.py`` calls :func:`use_interpreted` first): for a debugger or a
profiler that sees Python lines, and for the check that both forms decide alike
(``tests/sched/test_compiled_scheduler.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

#: dotted names below ``av_infer`` (``sched.scheduler`` -> av_infer/sched/scheduler.py)
#: (dependencies first: ``use_interpreted`` loads them in this order; the scheduler
#: imports the request module, the driver the scheduler; the latency recorders are
#: imported by the scheduler's statistics and the cpu device; the scheduler cimports the
#: devices' completion records, the cpu device's lane engine, the policies and the
#: statistics; the model services cimport the scheduler's ``Task`` and the model cache;
#: the admission, the runtime's request builder, cimports the input checks, the request
#: options, the registry, the driver and the request records)
PURE_MODULES: tuple[str, ...] = ("latency", "devices.completion", "sched.request",
                                 "sched.policies", "sched.stats", "devices.cpu_lanes",
                                 "sched.scheduler", "cache", "sched.model_services",
                                 "sched.driver", "inputs",
                                 "request_options", "registry", "admission")

_PKG = Path(__file__).resolve().parents[1]


def stale() -> list[str]:
    """``av_infer.<module>`` of every built extension older than its ``.py`` or ``.pxd``
    (not built at all is not stale: the ``.py`` runs)."""
    out = []
    for mod in PURE_MODULES:
        base = _PKG / mod.replace(".", "/")
        built = [p for s in EXTENSION_SUFFIXES if (p := base.with_name(base.name + s)).exists()]
        if not built:
            continue
        newest_src = max(p.stat().st_mtime for p in (base.with_suffix(".py"),
                                                     base.with_suffix(".pxd")) if p.exists())
        if min(p.stat().st_mtime for p in built) < newest_src:
            out.append(f"av_infer.{mod}")
    return out


def is_compiled(module: object) -> bool:
    """Whether ``module`` (one of ``PURE_MODULES``, imported) runs as a built extension."""
    return not str(getattr(module, "__file__", "")).endswith(".py")


def use_interpreted() -> None:
    """Import every ``PURE_MODULES`` entry from its ``.py`` (before anything else imports
    it), so the interpreter runs it even where an extension is built."""
    for mod in PURE_MODULES:
        name = f"av_infer.{mod}"
        if name in sys.modules:
            continue
        path = _PKG / (mod.replace(".", "/") + ".py")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # in sys.modules before its package is imported: a package whose ``__init__``
        # imports the module (av_infer.devices imports devices.completion through
        # devices.base) then gets this one, not the extension
        sys.modules[name] = module
        spec.loader.exec_module(module)
        parent, _, child = name.rpartition(".")
        setattr(importlib.import_module(parent), child, module)
