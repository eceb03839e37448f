# cython: annotation_typing=False, language_level=3
"""The model registry of one Runtime: models, their sources, variant groups and client
configurations, under one lock.

Why one owner: a request is resolved (client configuration -> variant group -> model
entry) on every submit; holding all four tables behind one lock lets that resolution take
one lock acquisition (``resolve``), and every change (load, unload, group, client) is made
whole under the same lock, so a submit never sees half of one. The registry holds *what is
loaded and how clients are configured*; it never talks to the device or the scheduler
(``engine.Engine`` does) and does no compiling, so every method is short and never blocks
on the scheduler while holding the lock.

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
    submit-error counts of one runtime. Thread-safe: every method takes ``lock`` (an
    RLock; callers may hold it around several calls)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
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
            self.models[entry.name] = entry
            if source is not None:
                self.sources[entry.name] = source

    def remove(self, name: str) -> ModelEntry | None:
        """Forget a model (None if unknown); refused while a variant group uses it."""
        with self.lock:
            used = [g for g, (grp, _, _) in self.groups.items() if name in grp.models]
            if used:
                raise InvalidParameterError(
                    f"model {name!r} is a variant of group(s) {used}; remove them first")
            return self.models.pop(name, None)

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
            self.clients[client] = cfg

    def resolve(self, model: str, client: str, variant_group: str | None
                ) -> tuple[ClientConfig, str | None, Group | None, ModelEntry | None]:
        """One request's look-up, under one lock acquisition (every submit): the client's
        configuration, the variant group that serves it (the request's, else the
        client's; None: none), that group, and the entry it runs on (None: unknown)."""
        with self.lock:
            cfg = self.clients.get(client) or DEFAULT_CLIENT
            gname = cfg.variant_group if variant_group is None else variant_group
            if gname is None:
                entry = self.models.get(model)
                if entry is None and model in self.groups:
                    entry = self.groups[model][1]
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
            self.groups[group.name] = (group, entry, GroupStats(group))

    def remove_group(self, name: str) -> None:
        """Forget a group (UnknownModelError if unknown); clients configured with it fall
        back to serving the model they name."""
        with self.lock:
            if self.groups.pop(name, None) is None:
                raise UnknownModelError(f"unknown variant group {name!r}")
            for client, cfg in list(self.clients.items()):
                if cfg.variant_group == name:
                    self.clients[client] = replace(cfg, variant_group=None)

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
