"""The runtime host's parameters in one table: each name's default, description, range,
constraints and whether it is read-only (a restart is needed) or live (applied while the
node runs, validated first). Declaration (``declare_parameters``), the live validator
(``validate``) and the Autoware-style schema (``param_schema``, which reads the declared
descriptors) all read this table, so a default or a range is written once in code;
``param/av_infer.param.yaml`` and ``param/av_infer_runtime.schema.json`` are checked
against it by tests/nodes/test_ros_param_schema.py.

Also here: the parsers of the structured string-array parameters (``client_models``,
``client_rates``) and the groups of parameters the node applies together.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from av_infer_nodes.common import declare
from av_infer_nodes.runtime_build import DEVICES, check_policy, policy_names

from av_infer import (
    BATCH_MODES,
    PRECISIONS,
    InvalidParameterError,
    check_batch_mode,
    load_qos_policy,
)


@dataclass(frozen=True)
class Param:
    """One parameter: what ``common.declare`` takes (array defaults as tuples, declared
    as lists; ``array_of`` the element type of an array parameter)."""

    name: str
    default: Any
    description: str
    read_only: bool = False
    int_range: tuple[int, int] | None = None
    float_range: tuple[float, float] | None = None
    array_of: type | None = None
    constraints: str = ""


def param_table() -> tuple[Param, ...]:
    """The table, in declaration order (the schema's and the YAML's order). A function,
    not a constant, because ``policy``'s choices are the runtime's policy table as it is
    when a node is built."""
    pol = ", ".join(policy_names())
    return (
    Param("device", "auto",
          "Device: auto (cuda when a GPU is usable; without one, cpu, "
          "with a warning in the log and /diagnostics) or one of "
          + ", ".join(DEVICES[1:]) + ".",
          read_only=True, constraints="one of " + ", ".join(DEVICES)),
    Param("models", ("tiny_cnn",),
          "Models to load at start: zoo names or ONNX file paths.",
          read_only=True, array_of=str),
    Param("model_variant", "scaled",
          "Zoo variant for zoo names: scaled or full.",
          read_only=True, constraints="scaled or full"),
    Param("pinned_models", (),
          "Models (entries of `models`) pinned in the model cache.",
          read_only=True, array_of=str),
    Param("precision", "fp32",
          "Numeric precision of every `models` entry without its own in "
          "model_precisions, and of load_model calls that name none. The "
          "device must run it (cpu: fp32 only; cuda: all three), else "
          "configure fails with the reason before any model loads.",
          read_only=True, constraints="one of " + ", ".join(PRECISIONS)),
    Param("model_precisions", (),
          "Per-model precision: entries MODEL=PRECISION, MODEL a `models` "
          "entry as written or its model name (zoo name or file stem).",
          read_only=True, array_of=str),
    Param("max_be_streams", 2,
          "BE tasks running concurrently (one stream each).",
          read_only=True, int_range=(1, 8)),
    Param("cpu_rt_parallel", 0,
          "cpu device: RT requests running at once, each on a "
          "lane of its own (0: one per core; 1: REEF's one at "
          "a time).", read_only=True, int_range=(0, 64)),
    Param("cpu_rt_priority", "off",
          "cpu device: OS priority of RT lanes: off, nice or "
          "fifo (where the OS permits; what was done, or why "
          "not, is in the device telemetry of /diagnostics).",
          read_only=True,
          constraints="off, nice or fifo"),
    Param("cpu_be_nice", 10,
          "cpu device: nice increment of BE lanes (0: default "
          "priority; reef_dkp needs > 0).", read_only=True,
          int_range=(0, 19)),
    Param("policy", "reef", "Scheduling policy: one of " + pol + ".",
          constraints="one of " + pol),
    Param("padding", False,
          "Dynamic kernel padding (REEF DKP) on top of policy reef."),
    Param("c", 4, "Device-queue capacity: kernels in flight per stream.",
          constraints="in the runtime's c_range: 1..the device's max_capacity "
          "(cpu/sim 4096, cuda 64), below every plan's reuse guard"),
    Param("edf_preempt", False,
          "Switch RT tasks at kernel boundaries when a more urgent "
          "one arrives (limited-preemptive EDF)."),
    Param("max_queue_depth", 0,
          "Queued requests per priority class beyond which "
          "arrivals are rejected (RejectedError; 0: unbounded).",
          int_range=(0, 1_000_000)),
    Param("be_min_share", 0.1,
          "BE's share of the device while RT is over capacity (0: "
          "strict RT priority): BE starved 50 ms by queued RT runs "
          "for share/(1-share) of that while new RT waits.",
          float_range=(0.0, 0.9)),
    Param("cache_budget_mb", 0,
          "Device memory budget of the model cache in MiB "
          "(0: unlimited).", int_range=(0, 1_048_576)),
    Param("batch_max", 1,
          "Adaptive batching of BE requests: largest batch (1: off).",
          int_range=(1, 64)),
    Param("batch_quantum_ms", 0.0,
          "Adaptive batching: period of the threshold update "
          "in ms (Rafiqi's quantum; 0: the runtime's 5 ms). "
          "Nothing ever waits for a batch to fill.",
          float_range=(0.0, 1000.0)),
    Param("batch_mode", "rafiqi",
          "How batch sizes and a variant group's variant are chosen "
          "(paper 001, docs/qos.md): rafiqi (adaptive threshold), "
          "eq2 (eq. 2), fixed (everything queued, at most fixed_max) "
          "or qos_rl (the learned policy qos_policy).",
          constraints="one of " + ", ".join(BATCH_MODES)),
    Param("qos_policy", "",
          "qos_rl's policy file (written by av-infer qos train); '' "
          "the committed one. Checked against every model and group."),
    Param("eq2_alpha", 0.5,
          "eq. 2's alpha: weight of D_B*R_t against the queue length.",
          float_range=(0.0, 1.0)),
    Param("eq2_beta", 1.0, "eq. 2's beta (> 0): scales B.",
          float_range=(0.001, 1000.0)),
    Param("eq2_b_thrd", 8,
          "eq2: batches of at least this many compare variants (below, "
          "the most accurate runs).", int_range=(1, 1024)),
    Param("rate_window_ms", 50.0,
          "eq2: window of the arrival rate R_t in ms.",
          float_range=(0.1, 60000.0)),
    Param("fixed_max", 32,
          "fixed: the largest batch (the paper's baseline: 32).",
          int_range=(1, 1024)),
    Param("variant_groups", (),
          "Variant groups (paper 001) defined at configure: names "
          "(letters, digits, _), each with variant_group.<name>."
          "models (loaded model names, most accurate first) and "
          "variant_group.<name>.kappas (accuracy factors in (0, 1]).",
          read_only=True, array_of=str),
    Param("diagnostics_period_s", 1.0,
          "Period of /diagnostics publications (s).",
          float_range=(0.05, 60.0)),
    Param("autostart", True,
          "Configure and activate at start (false: wait for "
          "~/change_state, as a lifecycle manager drives it).",
          read_only=True),
    Param("drain_timeout_s", 10.0,
          "Deactivate waits at most this long for accepted "
          "requests to be answered.", float_range=(0.0, 600.0)),
    Param("plan_cache", "",
          "On-disk plan cache: '' off, 'default' "
          "($AV_INFER_PLAN_CACHE or ~/.cache/av_infer/plans) or a "
          "directory; a restart then loads without compiling.",
          read_only=True),
    Param("model_services", False,
          "Serve /av_infer/load_model, unload_model and "
          "list_models (anyone on the graph can call them).",
          read_only=True),
    Param("model_dirs", (),
          "Directories load_model may read from (resolved; no '..' "
          "or symlink escape). Required with model_services.",
          read_only=True, array_of=str),
    Param("max_model_file_mb", 512,
          "Largest model file load_model reads (MiB).",
          read_only=True, int_range=(1, 65536)),
    Param("max_models", 16,
          "Most models loaded at once (load_model refuses more).",
          read_only=True, int_range=(1, 1024)),
    Param("max_request_tensors", 16,
          "Most tensors in one request.", read_only=True,
          int_range=(1, 1024)),
    Param("max_request_mb", 64,
          "Most tensor bytes in one request (MiB); checked "
          "before anything is allocated.", read_only=True,
          int_range=(1, 4096)),
    Param("client_rates", (),
          "Expected clients and their rates: entries CLIENT=HZ "
          "(0: no rate check). /diagnostics WARNs outside HZ ± "
          "rate_tolerance and is STALE once a client's answers "
          "stopped for stale_timeout_s.", array_of=str),
    Param("rate_tolerance", 0.1,
          "Accepted rate deviation, a fraction of the expected.",
          float_range=(0.0, 0.99)),
    Param("stale_timeout_s", 1.0,
          "A client of client_rates is STALE once no answer "
          "went to it for this long (s).",
          float_range=(0.01, 3600.0)),
    Param("deadline_miss_warn", 1,
          "A client's status WARNs from this many "
          "consecutive deadline misses.",
          int_range=(1, 100000)),
    Param("deadline_miss_error", 3,
          "...and is ERROR from this many (not below "
          "deadline_miss_warn).", int_range=(1, 100000)),
    Param("response_routing", "per_client",
          "Where answers go: per_client (each client's own "
          "topic /av_infer/response/<client>; no client "
          "receives another's) or shared (every answer on "
          "/av_infer/response, as before routing existed).",
          read_only=True, constraints="per_client or shared"),
    Param("max_response_topics", 256,
          "per_client: most per-client response publishers "
          "kept (the least recently used one is destroyed "
          "to make room).", read_only=True,
          int_range=(1, 65536)),
    Param("client_models", (),
          "Allow-list: entries CLIENT=MODEL[,MODEL...] (CLIENT * "
          "for every client without its own entry); requests "
          "for anything else are refused not_allowed. Empty: "
          "no allow-list.", array_of=str),
    Param("debug_topics", True,
          "Publish ~/debug/processing_time_ms, "
          "~/debug/pipeline_latency_ms and ~/debug/cyclic_time_ms.", read_only=True),
    Param("gc_freeze", True,
          "At activate, collect then gc.freeze() what exists: "
          "Python's full collections (which hold the GIL, so RT "
          "requests wait) then skip it. Process-wide.",
          read_only=True),
    )


#: Batching parameters -> ``Runtime.set_batching``'s ``params`` keys (and unit scale).
BATCH_PARAMS = {"eq2_alpha": ("alpha", 1.0), "eq2_beta": ("beta", 1.0),
                "eq2_b_thrd": ("b_thrd", 1), "rate_window_ms": ("rate_window", 1e-3),
                "fixed_max": ("fixed_max", 1)}
#: Every parameter ``_set_batching`` applies together.
BATCHING = ("batch_max", "batch_quantum_ms", "batch_mode", "qos_policy", *BATCH_PARAMS)
#: Parameters of the per-client health checks (``ClientHealth``), applied together.
CLIENT_HEALTH_PARAMS = ("client_rates", "rate_tolerance", "stale_timeout_s",
                        "deadline_miss_warn", "deadline_miss_error")
#: The live parameters a set batch is validated and applied against (the rest of a batch's
#: names are read-only, refused by ``validate``).
LIVE = ("policy", "padding", "c", "edf_preempt", "max_queue_depth", "be_min_share",
        "cache_budget_mb", *BATCHING, "diagnostics_period_s", *CLIENT_HEALTH_PARAMS)
#: A variant group's parameter names are ``variant_group.<name>.models|kappas``.
GROUP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


def defaults() -> dict[str, Any]:
    """Name -> default of every parameter of the table."""
    return {p.name: p.default for p in param_table()}


def ranges() -> dict[str, tuple[float, float]]:
    """Name -> (low, high) of every parameter with a declared range: the validator's
    bounds, inclusive at both ends (as ROS's IntegerRange/FloatingPointRange)."""
    return {p.name: (p.int_range or p.float_range) for p in param_table()
            if p.int_range or p.float_range}


def check_range(prm: Param, value: Any) -> str | None:
    """None if ``value`` has ``prm``'s type and lies in its declared range (both ends
    inclusive), else the reason. The one bounds check of the table: ``validate`` runs it
    for every ranged parameter, and ROS refuses the same values from the descriptor
    ``declare_parameters`` publishes, so the two cannot disagree. Unranged: None."""
    if prm.int_range is not None:
        lo, hi = prm.int_range
        if _is_int(value) and lo <= value <= hi:
            return None
        return f"{prm.name} must be an integer in {lo}..{hi}, got {value!r}"
    if prm.float_range is not None:
        lo, hi = prm.float_range
        if isinstance(value, float) and math.isfinite(value) and lo <= value <= hi:
            return None
        return f"{prm.name} must be a number in [{lo:g}, {hi:g}], got {value!r}"
    return None


def declare_parameters(node: Any) -> tuple[dict[str, Any], list[str]]:
    """Declares every parameter of the table on ``node`` (``common.declare``), then each
    group of ``variant_groups``; returns (name -> value, errors). ``errors``: parameters
    that cannot even be declared (a bad or repeated group name); configure refuses them."""
    errors: list[str] = []
    p: dict[str, Any] = {}
    for prm in param_table():
        default = list(prm.default) if prm.array_of is not None else prm.default
        p[prm.name] = declare(node, prm.name, default, prm.description,
                              read_only=prm.read_only, int_range=prm.int_range,
                              float_range=prm.float_range, array_of=prm.array_of,
                              constraints=prm.constraints)
    for name in p["variant_groups"]:
        key = f"variant_group.{name}"
        if not GROUP_NAME.fullmatch(name):
            errors.append(
                f"variant_groups: {name!r} is not a group name (a letter, then letters, "
                "digits or _; at most 64)")
            continue
        if node.has_parameter(f"{key}.models"):
            errors.append(f"variant_groups names {name!r} twice")
            continue
        p[f"{key}.models"] = declare(
            node, f"{key}.models", [], f"Variant group {name}: its models, most accurate "
            "first.", read_only=True, array_of=str)
        p[f"{key}.kappas"] = declare(
            node, f"{key}.kappas", [], f"Variant group {name}: accuracy factor kappa in "
            "(0, 1] of each model.", read_only=True, array_of=float)
    return p, errors


def parse_client_models(entries: list[str]) -> dict[str, frozenset[str]]:
    """The ``client_models`` allow-list: ``["front=yolo,det", "*=tiny_cnn"]`` -> client ->
    the models (and variant groups) it may name. Empty: no allow-list (every client may
    name every model). InvalidParameterError for a malformed entry or a client listed
    twice, so a refused value changes nothing."""
    out: dict[str, frozenset[str]] = {}
    for e in entries:
        client, sep, models = str(e).partition("=")
        client = client.strip()
        names = [m.strip() for m in models.split(",")] if sep else []
        if not client or not names or any(not m for m in names):
            raise InvalidParameterError(
                f"client_models entries are CLIENT=MODEL[,MODEL...] (CLIENT * for every "
                f"other client); got {e!r}")
        if client in out:
            raise InvalidParameterError(f"client_models names client {client!r} twice")
        out[client] = frozenset(names)
    return out


def model_precisions(p: dict[str, Any]) -> dict[str, str]:
    """Each ``models`` entry -> its precision: its ``model_precisions`` entry, else
    ``precision``. InvalidParameterError for a precision outside ``PRECISIONS``, a
    malformed entry, one naming no ``models`` entry or one named twice; whether the
    device runs them is ``runtime_build.check_precisions``'s question (it needs the
    runtime)."""
    models = [str(m) for m in p["models"]]
    names = {PurePath(m).stem: m for m in models}  # model_source's name (a zoo name's is itself)

    def known(prec: str, where: str) -> str:
        if prec not in PRECISIONS:
            raise InvalidParameterError(
                f"{where}: precision {prec!r} is not one of {', '.join(PRECISIONS)}")
        return prec

    default = known(str(p["precision"]), "precision")
    own: dict[str, str] = {}
    for e in p["model_precisions"]:
        model, sep, prec = str(e).partition("=")
        model, prec = model.strip(), prec.strip()
        if not sep or not model or not prec:
            raise InvalidParameterError(
                f"model_precisions entries are MODEL=PRECISION; got {e!r}")
        entry = model if model in models else names.get(model)
        if entry is None:
            raise InvalidParameterError(
                f"model_precisions: {model!r} is not an entry of models ({models}) nor the "
                "name of one")
        if entry in own:
            raise InvalidParameterError(f"model_precisions names {entry!r} twice")
        own[entry] = known(prec, f"model_precisions {e!r}")
    return {m: own.get(m, default) for m in models}


def parse_client_rates(entries: list[str]) -> dict[str, float]:
    """``client_rates``: ``["front=30", "rear=10"]`` -> client -> expected Hz (0: only
    staleness); InvalidParameterError for a malformed entry or a client named twice."""
    out: dict[str, float] = {}
    for e in entries:
        client, sep, hz = str(e).partition("=")
        client = client.strip()
        try:
            rate = float(hz) if sep else math.nan
        except ValueError:
            rate = math.nan
        if not client or not (0.0 <= rate <= 1000.0):
            raise InvalidParameterError(f"client_rates entries are CLIENT=HZ with HZ in "
                                        f"[0, 1000]; got {e!r}")
        if client in out:
            raise InvalidParameterError(f"client_rates names client {client!r} twice")
        out[client] = rate
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(name: str, value: Any, merged: dict[str, Any], runtime: Any,
             read_only: Callable[[str], bool]) -> str | None:
    """None if ``name=value`` may be applied (with the rest of its batch, ``merged``: the
    current live values with the batch's), else the reason it may not. ``runtime``: the
    node's Runtime or None (unconfigured: checks that need one are left to configure);
    ``read_only(name)``: whether a declared parameter is read-only.

    A ranged parameter's type and bounds come only from the table (``check_range``); the
    checks below add what a range cannot say (the runtime's ``c_range``, choices that
    depend on the device, one parameter against another)."""
    prm = {p.name: p for p in param_table()}.get(name)
    if prm is not None and (reason := check_range(prm, value)) is not None:
        return reason
    if name == "policy":
        if not isinstance(value, str):
            return "policy must be a string"
        return check_policy(value, runtime)
    if name == "padding":
        if not isinstance(value, bool):
            return "padding must be a bool"
        if value:
            if merged["policy"] not in ("reef", "reef_dkp"):
                return "padding needs policy reef"
            return check_policy("reef_dkp", runtime)
        return None
    if name == "c":  # the runtime's one range (Runtime.c_range), not a copy of it
        lo, hi = runtime.c_range if runtime is not None else (1, 1 << 30)
        ok = _is_int(value) and lo <= value <= hi
        return None if ok else f"c must be an integer in {lo}..{hi}, got {value!r}"
    if name == "edf_preempt":
        return None if isinstance(value, bool) else "edf_preempt must be a bool"
    if name == "batch_mode":
        try:
            check_batch_mode(value)
        except InvalidParameterError as exc:
            return str(exc)
        return None
    if name == "qos_policy":
        if not isinstance(value, str):
            return "qos_policy must be a path (string)"
        if value and runtime is None:  # else set_batching checks
            try:
                load_qos_policy(value)
            except InvalidParameterError as exc:
                return str(exc)
        return None
    if name in ("client_models", "client_rates"):
        parse = parse_client_models if name == "client_models" else parse_client_rates
        try:
            parse(list(value or []))
        except InvalidParameterError as exc:
            return str(exc)
        except TypeError:
            return f"{name} must be a string array"
        return None
    if name in ("deadline_miss_warn", "deadline_miss_error"):
        if merged["deadline_miss_warn"] > merged["deadline_miss_error"]:
            return (f"deadline_miss_warn ({merged['deadline_miss_warn']}) must not be "
                    f"above deadline_miss_error ({merged['deadline_miss_error']})")
        return None
    if read_only(name):
        return f"{name} is read-only (a restart is needed)"
    return None
