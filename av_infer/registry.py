# cython: annotation_typing=False, language_level=3
"""The model registry of one Runtime: models, their sources, variant groups and client
configurations, under one lock.

Why one owner: a request is resolved (client configuration -> variant group -> model
entry) on every submit; every change (load, unload, group, client) is made whole under
one lock, so a submit never sees half of one. The per-submit look-up (``resolve``) takes
no lock (docs/request_path.md, "The request path's last Python costs"): the writers
count a generation up before and after each change (odd while one is under way), and a
look-up that saw an odd generation, or a different one at its end, is made again under
the lock. Under the GIL, a look-up that saw the same even generation before and after
read tables no change touched in between: it returns what the locked look-up would
have returned at that moment (taking the lock a request was ~1 k instructions).

The registry holds *what is loaded and how clients are configured*; it never talks to the
device or the scheduler (``engine.Engine`` does) and does no compiling, so every method is
short and never blocks on the scheduler while holding the lock.

Compiled where built (``registry.pxd``, Cython's pure-Python mode,
av_infer/_cy/compiled.py): ``ModelRegistry`` is a ``cdef class`` whose ``resolve`` the
compiled admission calls as a C method on every submit; its tables keep their names
(``public`` fields). The ``.py`` is the one source and runs interpreted where not built.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from av_infer.errors import (
    InvalidParameterError,
    ModelNameInUseError,
    UnknownModelError,
)
from av_infer.qos import GroupStats, VariantGroup
from av_infer.sched.request import Priority
from av_infer.sched.scheduler import ModelEntry

__all__ = ["DEFAULT_CLIENT", "ClientConfig", "ModelRegistry"]


@dataclass(frozen=True)
class ClientConfig:
    """A client's defaults for its requests (``Runtime.configure_client``)."""

    priority: Priority = Priority.BE
    relative_deadline: float | None = None  # the soft deadline, relative to arrival
    drop_late: bool = False
    hard_deadline: float | None = None  # relative to arrival; None: none
    variant_group: str | None = None  # its requests are served by this group
    #: its deadline utility is tracked (soft/hard deadlines configured): the request path
    #: reads this flag instead of asking the tracker on every submit
    utility: bool = False


#: what an unconfigured client's requests get (read-only; shared)
DEFAULT_CLIENT = ClientConfig()

#: a variant group: its definition, the entry requests naming it run on, its quality stats
Group = tuple[VariantGroup, ModelEntry, GroupStats]


class ModelRegistry:
    """Models, ONNX sources (for batch plans), variant groups, client configurations and
    submit-error counts of one runtime. Thread-safe: every method but ``resolve`` takes
    ``lock`` (an RLock; callers may hold it around several calls); ``resolve`` reads
    without it unless a change is under way (the module docstring). Whoever changes
    ``models``, ``groups`` or ``clients`` does it through these methods (each brackets
    the change with ``_begin``/``_end``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: counted up before and after every change of the tables ``resolve`` reads
        #: (odd: a change is under way); written under ``lock`` only
        self._gen = 0
        self.models: dict[str, ModelEntry] = {}
        self.sources: dict[str, tuple[Any, Any, bool]] = {}  # name -> (source, shapes, whole)
        self.groups: dict[str, Group] = {}
        self.clients: dict[str, ClientConfig] = {}
        self.submit_errors: dict[str, int] = {}

    # -- models -----------------------------------------------------------------------------
    def check_free(self, name: str) -> None:
        """ModelNameInUseError if ``name`` is a loaded model."""
        with self.lock:
            if name in self.models:
                raise ModelNameInUseError(f"model {name!r} is already loaded; unload it first")

    def add(self, entry: ModelEntry, source: tuple[Any, Any, bool] | None) -> None:
        """Register a loaded model (``source``: what batch plans are compiled from; None
        for a ready Plan). ModelNameInUseError if the name was taken meanwhile."""
        with self.lock:
            if entry.name in self.models:
                raise ModelNameInUseError(f"model {entry.name!r} is already loaded")
            self._begin()
            try:
                self.models[entry.name] = entry
                if source is not None:
                    self.sources[entry.name] = source
            finally:
                self._end()

    def remove(self, name: str) -> ModelEntry | None:
        """Forget a model (None if unknown); refused while a variant group uses it."""
        with self.lock:
            used = [g for g, (grp, _, _) in self.groups.items() if name in grp.models]
            if used:
                raise InvalidParameterError(
                    f"model {name!r} is a variant of group(s) {used}; remove them first")
            self._begin()
            try:
                return self.models.pop(name, None)
            finally:
                self._end()

    def _begin(self) -> None:
        """A change of the tables ``resolve`` reads starts (under ``lock``)."""
        self._gen += 1

    def _end(self) -> None:
        """The change is whole (under ``lock``)."""
        self._gen += 1

    def names(self) -> list[str]:
        with self.lock:
            return list(self.models)

    def with_source(self, name: str) -> tuple[ModelEntry | None, tuple[Any, Any, bool] | None]:
        with self.lock:
            return self.models.get(name), self.sources.get(name)

    def entry(self, name: str) -> ModelEntry:
        """The entry ``name`` names (a model, or a variant group's); UnknownModelError."""
        with self.lock:
            e = self.models.get(name)
            if e is None and name in self.groups:
                e = self.groups[name][1]
            if e is None:
                raise UnknownModelError(f"unknown model {name!r}; loaded: {list(self.models)}")
        return e

    def reuse_guards(self) -> list[int]:
        """Every loaded plan's reuse guard (``c`` must stay below each)."""
        with self.lock:
            return [e.plan.reuse_guard for e in self.models.values()]

    # -- clients ----------------------------------------------------------------------------
    def set_client(self, client: str, cfg: ClientConfig) -> None:
        """Configure ``client``; UnknownModelError (nothing changed) if its group is not
        defined (checked under the lock that defines and removes groups)."""
        with self.lock:
            if cfg.variant_group is not None and cfg.variant_group not in self.groups:
                raise UnknownModelError(f"unknown variant group {cfg.variant_group!r}; "
                                        f"defined: {self.variant_groups()}")
            self._begin()
            self.clients[client] = cfg
            self._end()

    def resolve(self, model: str, client: str, variant_group: str | None
                ) -> tuple[ClientConfig, str | None, Group | None, ModelEntry | None]:
        """One request's look-up (every submit): the client's configuration, the variant
        group that serves it (the request's, else the client's; None: none), that group,
        and the entry it runs on (None: unknown). As of one moment between changes: read
        without the lock when no change overlapped it, else again under the lock."""
        gen = self._gen
        if not gen & 1:
            got = self._look(model, client, variant_group)
            if self._gen == gen:
                return got
        with self.lock:
            return self._look(model, client, variant_group)

    def _look(self, model: str, client: str, variant_group: str | None) -> tuple:
        cfg = self.clients.get(client) or DEFAULT_CLIENT
        gname = cfg.variant_group if variant_group is None else variant_group
        if gname is None:
            entry = self.models.get(model)
            if entry is None:
                grp = self.groups.get(model)
                if grp is not None:
                    entry = grp[1]
            return cfg, None, None, entry
        grp = self.groups.get(gname)
        return cfg, gname, grp, None if grp is None else grp[1]

    def count_submit_error(self, code: str) -> None:
        with self.lock:
            self.submit_errors[code] = self.submit_errors.get(code, 0) + 1

    # -- variant groups ---------------------------------------------------------------------
    def group_bases(self, group: VariantGroup) -> list[ModelEntry]:
        """The loaded entries of ``group``'s models; refused (nothing changes) if its name
        is taken or a model is not loaded."""
        with self.lock:
            if group.name in self.models or group.name in self.groups:
                raise InvalidParameterError(
                    f"{group.name!r} is already a model or variant group")
            missing = [m for m in group.models if m not in self.models]
            if missing:
                raise UnknownModelError(f"variant group {group.name!r}: models {missing} "
                                        f"are not loaded; loaded: {list(self.models)}")
            return [self.models[m] for m in group.models]

    def add_group(self, group: VariantGroup, entry: ModelEntry) -> None:
        with self.lock:
            stats = GroupStats(group)
            self._begin()
            self.groups[group.name] = (group, entry, stats)
            self._end()

    def remove_group(self, name: str) -> None:
        """Forget a group (UnknownModelError if unknown); clients configured with it fall
        back to serving the model they name."""
        with self.lock:
            if name not in self.groups:
                raise UnknownModelError(f"unknown variant group {name!r}")
            self._begin()
            try:
                del self.groups[name]
                for client, cfg in list(self.clients.items()):
                    if cfg.variant_group == name:
                        self.clients[client] = replace(cfg, variant_group=None)
            finally:
                self._end()

    def group(self, name: str) -> Group | None:
        with self.lock:
            return self.groups.get(name)

    def variant_groups(self) -> dict[str, dict[str, float]]:
        """Group name -> {model: κ}, most accurate first."""
        with self.lock:
            return {n: {v.model: v.kappa for v in g.variants}
                    for n, (g, _, _) in self.groups.items()}

    def group_stats(self) -> dict[str, GroupStats]:
        with self.lock:
            return {n: g[2] for n, g in self.groups.items()}
