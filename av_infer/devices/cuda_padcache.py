"""The cuda device's padded dispatcher modules (DKP, kernels/cuda/padding.py), one per set of
resident plans: compiled (through the disk compile cache) on a background thread the first
time a set is asked for, looked up on the launch path, unloaded when the device closes.

Why a class of its own: compiling and caching padded modules is a responsibility apart from
launching (``CudaDevice.pad_kernel`` only asks "is a module for these plans ready?") and
from memory. Guarantees: one compilation per set of plans however many launches ask; a
module over more plans serves a set it contains; a module that failed to build says why
(``errors``) and its plans run unpadded; modules holding an unloaded plan's bodies stay
loaded until :meth:`unload_all` (a padded launch in flight may still run them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from av_infer.kernels.cuda.padding import OCC_LEVELS, PaddedModule, build_padded_module
from av_infer.kernels.cuda_compile import CompileCache, Compiler

__all__ = ["PadModule", "PadModuleCache"]

log = logging.getLogger("av_infer.devices.cuda")


@dataclass
class PadModule:
    """A compiled padded dispatcher module (or one being compiled: ``ready`` unset)."""

    ready: threading.Event = field(default_factory=threading.Event)
    module: int = 0
    padded: PaddedModule | None = None
    funcs: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    #: variant name -> local memory bytes per thread (register spills), as compiled
    local_bytes: dict[str, int] = field(default_factory=dict)


class PadModuleCache:
    """Padded modules by set of loaded plans (``handles``: the device's model records, with
    ``.src`` and ``.plan``); ``disp`` loads images and resolves functions; ``levels``: the
    occupancy levels of the proxy variants each module holds."""

    def __init__(self, disp: Any, cache: CompileCache, compiler: Compiler, arch: str,
                 levels: Sequence[int] = OCC_LEVELS) -> None:
        self._disp = disp
        self.levels = tuple(levels)
        self._cache = cache
        self._compiler = compiler
        self._arch = arch
        self._lock = threading.Lock()
        self._modules: dict[frozenset[int], PadModule] = {}
        #: launch-path shortcut: (RT model id, part model ids...) -> a ready module
        self._ready: dict[tuple[int, ...], PadModule] = {}
        self._retired: list[PadModule] = []

    def in_use(self) -> bool:
        """Some padded module was asked for (tasks then upload their structs up front)."""
        return bool(self._modules)

    def get(self, handles: Sequence[Any], wait: bool = False) -> PadModule:
        """The padded module of ``handles``' plans, usable once ``ready`` is set and
        ``padded`` is not None (``error`` says why not); a first request starts its
        compilation on a background thread (``wait``: here, and returns when done)."""
        key = frozenset(id(h) for h in handles)
        with self._lock:
            pm = self._modules.get(key)
            if pm is None:  # a ready module over more plans serves as well
                pm = next((m for k, m in self._modules.items()
                           if key <= k and m.padded is not None), None)
            start = pm is None
            if start:
                pm = self._modules[key] = PadModule()
        if start:
            uniq = list({id(h): h for h in handles}.values())
            if wait:
                self._build(pm, uniq)
            else:
                threading.Thread(target=self._build, args=(pm, uniq),
                                 name="av_infer-cuda-padcompile", daemon=True).start()
        if wait:
            pm.ready.wait()
        return pm

    def ready_for(self, rt: Any, parts: Sequence[Any]) -> PadModule | None:
        """The ready module for a launch of ``rt``'s kernel padded with kernels of ``parts``
        (model records), or None while it compiles or when it failed (start compiling it
        if nobody asked yet). The launch path: one dict lookup once it is ready."""
        key = (id(rt), *(id(m) for m in parts))
        pm = self._ready.get(key)
        if pm is None:
            pm = self.get([rt, *parts])
            if not pm.ready.is_set() or pm.padded is None:
                return None
            self._ready[key] = pm
        return pm

    def _build(self, pm: PadModule, handles: list[Any]) -> None:
        try:
            padded = build_padded_module([h.src for h in handles], self.levels)
            image = self._cache.get_or_compile(self._compiler, padded.source, self._arch, ())
            pm.module = self._disp.load_module(image)
            pm.funcs = {name: self._disp.get_function(pm.module, name)
                        for name in padded.variants.values()}
            # registers / local (spill) bytes per variant as compiled: what the ``regs``
            # selection compares with the plain kernels' (cuFuncGetAttribute 4 and 3)
            padded.variant_regs = {occ: int(self._disp.func_attribute(pm.funcs[name], 4))
                                   for occ, name in padded.variants.items()}
            pm.local_bytes = {name: int(self._disp.func_attribute(pm.funcs[name], 3))
                              for name in padded.variants.values()}
            pm.padded = padded
        except Exception as e:  # noqa: BLE001 - reported by prepare_padding / telemetry
            pm.error = f"{type(e).__name__}: {e}"
            log.warning("padded dispatcher module for %s failed; those plans run "
                        "unpadded: %s", [h.plan.name for h in handles], pm.error)
        finally:
            pm.ready.set()

    def forget_plan(self, handle: Any) -> None:
        """``handle``'s plan is being unloaded: no new launch uses a module holding its
        bodies (they are unloaded at :meth:`unload_all`)."""
        with self._lock:
            for key in [k for k in self._modules if id(handle) in k]:
                self._retired.append(self._modules.pop(key))
            self._ready.clear()

    def unload_all(self) -> None:
        """Unload every module (device close: nothing runs any more); waits for builds."""
        with self._lock:
            mods = [*self._modules.values(), *self._retired]
            self._modules.clear()
            self._ready.clear()
            self._retired.clear()
        for pm in mods:
            pm.ready.wait()
            if pm.module:
                self._disp.unload_module(pm.module)

    def stats(self) -> dict[str, Any]:
        """Telemetry: ready modules, modules compiling, build errors, and per ready module
        its variants' registers and local (spill) bytes per thread as compiled."""
        with self._lock:
            mods = list(self._modules.values())
        return {"modules": sum(1 for m in mods if m.padded is not None),
                "compiling": sum(1 for m in mods if not m.ready.is_set()),
                "errors": [m.error for m in mods if m.error],
                "variants": [{name: {"regs": m.padded.variant_regs.get(occ),
                                     "local_bytes": m.local_bytes.get(name)}
                              for occ, name in m.padded.variants.items()}
                             for m in mods if m.padded is not None]}
