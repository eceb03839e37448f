"""Fuzz of the request topic (issue 16): hypothesis-generated requests published on
/av_infer/request to a runtime host in its own process; every one is answered exactly
once, with a typed code, and the process stays alive and keeps serving.

What is generated (``fuzz_case``): valid requests (normal and random-bit inputs, NaN/inf
values included) and every field of the header varied: ids (UUID-like, unicode, lone
surrogates, exactly ``MAX_ID_LEN``, and unusable ones: missing, empty, too long, not a
string), versions, models (unknown, empty, not a string), priorities (valid in any case,
invalid values), deadlines (NaN, +-inf, zero, negative, tiny, huge, huge integers, not a
number), ``drop_late``, clients and frame ids (empty, unicode, lone surrogates, very long,
not a string), stamps (extremes, out of range, wrong shape), unknown extra fields; tensors
that decode but do not fit the model (any dtype, rank 0..``MAX_RANK``, payloads up to
``MAX_BYTES``, wrong/extra names, up to ``MAX_TENSORS`` tensors) and ones the codec must
refuse (``nbytes`` not shape x dtype, bytes out of range, truncated data, unknown dtypes,
bad shapes, rank > ``MAX_RANK``, > ``MAX_TENSORS`` tensors, duplicate names, missing
fields); and broken encodings (truncated or garbage JSON, non-object JSON, deep nesting,
an empty label, no layout dims). Each case carries the code it must get.

Checked: each request with a usable id gets exactly one response, with its id and the
expected code; requests without a usable id are answered with ``id ""`` (counted: as many
as were sent); no response fails to decode; the host's /diagnostics ``submit_errors``
count the unknown_model/invalid_input answers; a valid request still succeeds at the end
and the process is alive. Garbage below the message level (CDR that does not deserialize)
never reaches the node; ``test_undeserializable_messages_do_not_hurt_the_host`` checks that
it does not hurt it either. ``REGRESSION_BATCH`` runs first whatever the seed: what the fuzz
found, and the limits. The last two tests pin two codec findings (/tmp/coord/findings.md R1,
R2) and fail until the codec raises CodecError for them; the host already answers those
requests with their id (``runtime_node.readable_id``).

Size: ``AV_INFER_FUZZ_N`` requests (default 300; ``make soak`` runs 10,000), sent in
batches of ``BATCH`` and answered before the next batch (the topics are reliable with a
depth of 64, so nothing is overwritten). Seeded (derandomized) unless
``AV_INFER_FUZZ_SEED`` is set. Waits are hang guards (``WAIT_S``), never timings.

Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import json
import math
import os
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
hypothesis = pytest.importorskip("hypothesis")

from av_infer_nodes.common import (  # noqa: E402
    LATCHED_QOS,
    MODELS_TOPIC,
    REQUEST_QOS,
    REQUEST_TOPIC,
    RESPONSE_TOPIC,
    from_msg,
    to_msg,
)
from av_infer_nodes.testing import (  # noqa: E402
    WAIT_S,
    NodeProcess,
    RosHarness,
    wait_for,
)
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rclpy.serialization import serialize_message  # noqa: E402
from std_msgs.msg import MultiArrayDimension, String, UInt8MultiArray  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(3600)]  # a hang guard

N_REQUESTS = int(os.environ.get("AV_INFER_FUZZ_N", "300"))
FUZZ_SEED = os.environ.get("AV_INFER_FUZZ_SEED")
#: requests published before waiting for their answers (< the topics' depth of 64)
BATCH = 25
#: largest payload of one request (the codec has no limit of its own): some wrong shapes and
#: one case of REGRESSION_BATCH get up to this much, most stay under 64 KiB
MAX_BYTES = 4 << 20
MODEL = "tiny_cnn"
INPUT, SHAPE, DTYPE = "input", [1, 3, 32, 32], "float32"
#: every code a fuzzed request may get; anything else (internal_error, ...) is a bug
CODES = {"ok", codec.MALFORMED, "unknown_model", "invalid_input", "deadline_missed"}
#: a header or spec field left out (instead of given this value)
ABSENT = "\x00absent\x00"


# -- cases ---------------------------------------------------------------------------------
@dataclass
class Case:
    """One generated request: a header (the id filled in when built), tensors to pack,
    mutations, and what it must be answered with."""

    header: dict[str, Any]
    tensors: list[tuple[str, str, list[int]]]  # (name, dtype, shape), packed consistently
    seed: int
    what: list[str] = field(default_factory=list)
    id_kind: str = "valid"  # valid: a fresh unique id; otherwise the unusable id is in header
    id_suffix: str = ""
    malformed: bool = False  # the codec must refuse it
    spec_mutation: tuple[Any, ...] | None = None
    data_mutation: tuple[str, int] | None = None
    label_mutation: tuple[str, Any] | None = None  # makes the id unreadable
    normal_input: bool = True
    ensure_ascii: bool = True

    def __repr__(self) -> str:  # hypothesis prints falsifying batches: keep them short
        return f"Case({'; '.join(self.what) or 'valid'}, seed={self.seed})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis's pretty printer
        p.text(repr(self))


@dataclass
class Built:
    msg: UInt8MultiArray
    rid: str  # "" when no usable id
    expect: frozenset[str]
    case: Case
    echo: dict[str, Any] | None = None  # client/frame_id/stamp the answer must echo


_UNIQUE = iter(range(10**12))


def _valid_id(kind: str, suffix: str) -> str:
    head = f"fz{next(_UNIQUE):07d}-"
    if kind == "max":
        return (head + uuid.uuid4().hex * 4)[: codec.MAX_ID_LEN]
    return (head + suffix)[: codec.MAX_ID_LEN]


def _numpy_refuses(dname: str, shape: list[int]) -> bool:
    """A zero-size shape whose other dimensions overflow numpy's size ("array is too
    big")."""
    if math.prod(shape):
        return False
    try:
        np.empty(0, codec.DTYPES[dname]).reshape(shape)
    except ValueError:
        return True
    return False


def build(case: Case) -> Built:
    """Case -> the message to publish, the id it is answered with and the codes allowed."""
    header = dict(case.header)
    rid = ""
    if case.id_kind == "valid" or case.id_kind == "max":
        rid = _valid_id(case.id_kind, case.id_suffix)
        header["id"] = rid
    rng = np.random.default_rng(case.seed)
    specs: list[Any] = []
    chunks: list[bytes] = []
    offset = 0
    for name, dname, shape in case.tensors:
        dtype = codec.DTYPES[dname]
        nbytes = math.prod(shape) * dtype.itemsize
        if case.normal_input and dname == "float32":
            raw = rng.standard_normal(math.prod(shape), dtype=np.float32).tobytes()
        else:  # random bits: NaN/inf floats, any bool byte
            raw = rng.bytes(nbytes)
        specs.append({"name": name, "dtype": dname, "shape": list(shape), "offset": offset,
                      "nbytes": nbytes})
        chunks.append(raw)
        offset += nbytes
    data = b"".join(chunks)
    malformed = case.malformed
    if case.data_mutation is not None:
        kind, k = case.data_mutation
        if kind == "truncate":
            cut = max(0, len(data) - k)
            data = data[:cut]
            if isinstance(specs, list) and any(
                    isinstance(s, dict) and isinstance(s.get("offset"), int)
                    and isinstance(s.get("nbytes"), int) and s["offset"] + s["nbytes"] > cut
                    for s in specs):
                malformed = True
        else:  # trailing bytes are allowed
            data += rng.bytes(k)
    if case.spec_mutation is not None:
        kind, *args = case.spec_mutation
        i = args[0] % len(specs) if specs else 0
        if kind == "tensors":  # 'tensors' is not a list
            specs = args[1]
        elif kind == "set":  # a field replaced (or deleted: value is the placeholder)
            key, value = args[1], args[2]
            if value is ABSENT:
                specs[i].pop(key)
            else:
                specs[i][key] = value
        elif kind == "nbytes":
            specs[i]["nbytes"] += args[1]
        elif kind == "offset_out":
            specs[i]["offset"] = len(data) - specs[i]["nbytes"] + args[1]
        elif kind == "duplicate":
            specs.append(dict(specs[i]))
        elif kind == "not_object":
            specs[i] = args[1]
    header["tensors"] = specs
    if "tensors_missing" in case.what:
        header.pop("tensors")
    label = json.dumps(header, ensure_ascii=case.ensure_ascii)
    try:
        label.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates only travel escaped
        label = json.dumps(header)
    msg = to_msg(label, data)
    if case.label_mutation is not None:
        kind, arg = case.label_mutation
        rid = ""
        if kind == "cut":
            msg = to_msg(label[: int(len(label) * arg)], data)
        elif kind == "garbage":
            msg = to_msg(arg, data)
        elif kind == "nodims":
            msg = UInt8MultiArray()
            msg.data = data
    if not rid:
        return Built(msg, "", frozenset({codec.MALFORMED}), case)
    if malformed:
        return Built(msg, rid, frozenset({codec.MALFORMED}), case)
    echo = {"client": header.get("client") or "remote", "frame_id": header.get("frame_id") or "",
            "stamp": tuple(header.get("stamp") or (0, 0))}
    code = "invalid_input"
    if header["model"] != MODEL:
        code = "unknown_model"
    elif [(n, d, list(s)) for n, d, s in case.tensors] == [(INPUT, DTYPE, SHAPE)]:
        code = "ok"
    if any(_numpy_refuses(d, s) for _, d, s in case.tensors):
        # finding 2: numpy cannot make this zero-size array; the codec raises ValueError
        # (the host answers with the id anyway): malformed_request, or, if the codec comes
        # to accept it, what the runtime says
        return Built(msg, rid, frozenset({codec.MALFORMED, code}), case, echo)
    if code != "ok":
        return Built(msg, rid, frozenset({code}), case, echo)
    expect = {"ok"}
    if header.get("drop_late") and header.get("deadline_s") is not None:
        expect.add("deadline_missed")
    return Built(msg, rid, frozenset(expect), case, echo)


# -- strategies ----------------------------------------------------------------------------
TEXT = st.text(max_size=24)
SURROGATE = st.sampled_from(["\ud800", "a\udfffb", "\udc80x"])
JSON_JUNK = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT,
                      st.lists(st.integers(), max_size=3), st.dictionaries(TEXT, st.integers(),
                                                                          max_size=2))


def _long(text: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Very long strings without drawing every character."""
    return st.builds(lambda s, k: (s or "x") * k, text, st.integers(100, 20_000))


NAMES = st.one_of(st.sampled_from(["", "tester", "camera_front", "monitoring"]), TEXT,
                  _long(TEXT), SURROGATE)


@st.composite
def invalid_id(draw) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["missing", "empty", "too_long", "not_str"]))
    value: Any = {"missing": ABSENT, "empty": "",
                  "too_long": "x" * draw(st.integers(codec.MAX_ID_LEN + 1, 4096)),
                  "not_str": None}[kind]
    if kind == "not_str":
        value = draw(st.one_of(st.none(), st.integers(), st.floats(), st.booleans(),
                               st.lists(st.text(min_size=1, max_size=4), max_size=2)))
    return kind, value


@st.composite
def mismatched_tensors(draw) -> tuple[list[tuple[str, str, list[int]]], str]:
    """Tensors the codec accepts but tiny_cnn does not."""
    kind = draw(st.sampled_from(["dtype", "shape", "name", "extra", "none", "many"]))
    big = draw(st.integers(0, 99)) < 10  # some get payloads up to MAX_BYTES
    dnames = list(codec.DTYPES)
    if kind == "dtype":
        dname = draw(st.sampled_from([d for d in dnames if d != DTYPE]))
        return [(INPUT, dname, SHAPE)], f"dtype {dname}"
    if kind == "shape":
        dname = draw(st.sampled_from(dnames))
        rank = draw(st.integers(0, codec.MAX_RANK))
        limit = (MAX_BYTES if big else 64 << 10) // codec.DTYPES[dname].itemsize
        shape: list[int] = []
        for _ in range(rank):
            room = max(1, limit // max(1, math.prod(shape)))
            shape.append(draw(st.integers(0, min(room, 4096))))
        if shape == SHAPE and dname == DTYPE:
            shape.append(1)
        return [(INPUT, dname, shape)], f"shape {dname}{shape}"
    if kind == "name":
        name = draw(st.text(min_size=1, max_size=16).filter(lambda s: s != INPUT))
        return [(name, DTYPE, SHAPE)], "wrong name"
    if kind == "extra":
        return [(INPUT, DTYPE, SHAPE), ("extra", "uint8", [draw(st.integers(0, 64))])], "extra"
    if kind == "none":
        return [], "empty tensors"
    n = draw(st.integers(2, codec.MAX_TENSORS))
    return [(f"t{i}", "uint8", [draw(st.integers(0, 8))]) for i in range(n)], f"many {n}"


@st.composite
def spec_mutation(draw) -> tuple[tuple[Any, ...], str]:
    """A change to the tensor specs the codec must refuse."""
    i = draw(st.integers(0, 7))
    kind = draw(st.sampled_from(["nbytes", "offset_out", "dtype", "shape", "missing", "name",
                                 "duplicate", "not_object", "tensors", "huge"]))
    if kind == "nbytes":
        d = draw(st.one_of(st.integers(-8, 8).filter(bool), st.just(2**70)))
        return ("nbytes", i, d), f"nbytes {d:+d}"
    if kind == "offset_out":
        k = draw(st.integers(1, 1 << 20))
        return ("offset_out", i, k), f"offset {k} past the end"
    if kind == "dtype":
        v = draw(st.one_of(st.sampled_from(["bfloat16", "float8", "complex64", "", "FLOAT32",
                                            "<f4", "object"]),
                           st.none(), st.integers()))
        return ("set", i, "dtype", v), f"dtype {v!r}"
    if kind == "shape":
        v = draw(st.one_of(
            st.lists(st.integers(0, 2), min_size=codec.MAX_RANK + 1, max_size=12),
            st.lists(st.integers(-5, -1), min_size=1, max_size=3),
            st.just([1.0, 3, 32, 32]), st.just([True, 3]), st.just("1x3"), st.none(),
            st.just([[1, 3]]), st.just({"0": 1})))
        return ("set", i, "shape", v), f"shape {v!r}"[:60]
    if kind == "missing":
        key = draw(st.sampled_from(["name", "dtype", "shape", "offset", "nbytes"]))
        return ("set", i, key, ABSENT), f"missing {key}"
    if kind == "name":
        v = draw(st.one_of(st.just(""), st.none(), st.integers()))
        return ("set", i, "name", v), f"name {v!r}"
    if kind == "duplicate":
        return ("duplicate", i), "duplicate tensor"
    if kind == "not_object":
        return ("not_object", i, draw(st.one_of(st.integers(), TEXT, st.just([])))), \
            "spec not an object"
    if kind == "tensors":
        v = draw(st.one_of(st.none(), st.integers(), TEXT, st.just({"input": {}})))
        return ("tensors", i, v), f"tensors {v!r}"[:60]
    big = draw(st.sampled_from([2**62, 2**31, 10**30]))
    return ("set", i, "shape", [big, big]), "huge dims"


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond any float: not a number of seconds
        return False


@st.composite
def fuzz_case(draw) -> Case:
    what: list[str] = []
    malformed = False
    header: dict[str, Any] = {"v": 1, "model": MODEL, "priority": "RT"}

    def vary(p: int) -> bool:  # mutate a field with probability p %
        return draw(st.integers(0, 99)) < p

    #: about half the cases carry faults the codec must refuse; the others only valid
    #: variations (which the runtime may still refuse: unknown model, wrong tensors)
    faults = vary(50)

    def fault(p: int) -> bool:
        return faults and vary(p)

    # id
    id_kind, id_suffix = "valid", ""
    if fault(12):
        id_kind, value = draw(invalid_id())
        if value is not ABSENT:
            header["id"] = value
        what.append(f"id {id_kind}")
    elif vary(10):
        id_kind = "max"
        what.append("id of MAX_ID_LEN")
    else:
        id_suffix = draw(st.one_of(st.uuids().map(lambda u: u.hex), TEXT, SURROGATE))
    # version
    if fault(8):
        v = draw(st.sampled_from([0, 2, "1", None, 1.5, ABSENT, 1.0, True]))
        if v is ABSENT:
            header.pop("v")
        else:
            header["v"] = v
        what.append(f"v {v!r}")
        malformed |= not (v is not ABSENT and v == 1)
    # model
    if vary(8):
        m = draw(st.one_of(st.sampled_from(["resnet152", "tiny_cnn ", "TINY_CNN"]),
                           TEXT.filter(bool), _long(TEXT)))
        if faults and vary(50):
            m = draw(st.one_of(st.just(""), st.none(), st.integers(), st.just(ABSENT)))
        if m is ABSENT:
            header.pop("model")
        else:
            header["model"] = m
        what.append(f"model {m!r}"[:60])
        malformed |= not (isinstance(m, str) and m and m is not ABSENT)
    # priority
    if vary(15):
        p = draw(st.sampled_from(["BE", "rt", "be", "Rt", "bE"]))
        if faults and vary(50):
            p = draw(st.one_of(st.sampled_from(["XX", "", "R T", "RTBE"]), TEXT, st.none(),
                               st.integers(), st.just(ABSENT)))
        if p is ABSENT:
            header.pop("priority")
        else:
            header["priority"] = p
        what.append(f"priority {p!r}"[:60])
        malformed |= not (isinstance(p, str) and p.upper() in codec.PRIORITIES)
    # deadline
    if vary(30):
        if not fault(50):  # valid: null, tiny, ordinary, huge
            d = draw(st.one_of(st.sampled_from([None, 1e-300, 1e-12, 1e-3, 0.033, 5, WAIT_S,
                                                1e308]),
                               st.floats(min_value=1e-9, max_value=1e9), st.integers(1, 10**6)))
        else:
            d = draw(st.one_of(
                st.sampled_from([math.nan, math.inf, -math.inf, 0, 0.0, -0.0, -1, -1e-9,
                                 "0.1", True, False, [0.1], {}, 10**400, -(10**400)]),
                st.floats(max_value=0.0), st.integers(max_value=0)))
        header["deadline_s"] = d
        what.append(f"deadline {d!r}"[:60])
        ok = d is None or (isinstance(d, int | float) and not isinstance(d, bool)
                           and _finite(d) and d > 0)
        malformed |= not ok
    else:
        header["deadline_s"] = WAIT_S if vary(50) else None
    if vary(15):
        dl = draw(st.one_of(st.booleans(), st.none(), st.just("yes"), st.just(1))
                  if faults else st.booleans())
        header["drop_late"] = dl
        what.append(f"drop_late {dl!r}")
        malformed |= not isinstance(dl, bool)
    # client, frame_id
    for key in ("client", "frame_id"):
        if vary(40):
            v = draw(st.one_of(NAMES, st.none()) if not fault(15) else
                     st.one_of(st.integers(), st.just(["a"]), st.just({"a": 1})))
            header[key] = v
            what.append(f"{key} {v!r}"[:60])
            malformed |= not (v is None or isinstance(v, str))
    # stamp
    if vary(20):
        s = draw(st.one_of(
            st.sampled_from([[0, 0], [1, 0], [-(2**31), 0], [2**31 - 1, 999_999_999], None]),
            st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(0, 999_999_999)).map(list)))
        if faults and vary(50):
            s = draw(st.one_of(
                st.sampled_from([[0, 10**9], [2**31, 0], [-(2**31) - 1, 0], [0, -1], [1],
                                 [1, 2, 3], "now", [1.5, 0], [True, 0], {"sec": 1}]),
                st.lists(st.integers(), min_size=2, max_size=2)))
        header["stamp"] = s
        what.append(f"stamp {s!r}")
        ok = s is None or (isinstance(s, list) and len(s) == 2
                           and all(isinstance(v, int) and not isinstance(v, bool) for v in s)
                           and -(2**31) <= s[0] < 2**31 and 0 <= s[1] < 10**9)
        malformed |= not ok
    if vary(5):
        header[draw(TEXT.filter(lambda k: k not in header and k != "id" and k != "tensors"))] \
            = draw(JSON_JUNK)
        what.append("unknown field")
    # tensors
    tensors = [(INPUT, DTYPE, SHAPE)]
    if vary(25):
        tensors, why = draw(mismatched_tensors())
        what.append(why)
    sm = None
    if fault(30):
        sm, why = draw(spec_mutation())
        if tensors or sm[0] == "tensors":
            malformed = True
            what.append(why)
        else:
            sm = None
    if fault(4):
        what.append("tensors_missing")
        malformed = True
    dm = None
    if vary(10):
        dm = (draw(st.sampled_from(["truncate", "extend"] if faults else ["extend"])),
              draw(st.integers(1, 1 << 16)))
        what.append(f"{dm[0]} {dm[1]}")
    lm = None
    if fault(12):
        kind = draw(st.sampled_from(["cut", "garbage", "nodims", "empty", "nonobject",
                                     "nested"]))
        if kind == "cut":
            lm = ("cut", draw(st.floats(0.0, 0.999)))
        elif kind == "garbage":
            lm = ("garbage", draw(st.one_of(TEXT, _long(TEXT)).filter(
                lambda s: not s.lstrip().startswith("{"))))
        elif kind == "nodims":
            lm = ("nodims", None)
        elif kind == "empty":
            lm = ("garbage", "")
        elif kind == "nonobject":
            lm = ("garbage", json.dumps(draw(st.one_of(
                st.none(), st.integers(), st.lists(st.integers(), max_size=3), TEXT))))
        else:
            depth = draw(st.integers(1, 200_000))
            lm = ("garbage", "[" * depth + "]" * depth)
        what.append(f"label {kind}")
    return Case(header=header, tensors=tensors, seed=draw(st.integers(0, 2**32 - 1)),
                what=what, id_kind=id_kind, id_suffix=id_suffix, malformed=malformed,
                spec_mutation=sm, data_mutation=dm, label_mutation=lm,
                normal_input=draw(st.booleans()), ensure_ascii=draw(st.booleans()))


# -- the host and its answers --------------------------------------------------------------
class Answers:
    """Responses by id (decoded in the subscription callback), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_id: dict[str, list[codec.TensorResponse]] = {}
        self.undecodable: list[str] = []
        self.total = 0

    def __call__(self, msg: UInt8MultiArray) -> None:
        try:
            resp = codec.decode_response(*from_msg(msg))
        except Exception as exc:  # noqa: BLE001 - recorded, asserted on
            with self._lock:
                self.undecodable.append(f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self.by_id.setdefault(resp.id, []).append(resp)
            self.total += 1

    def count(self, rid: str) -> int:
        with self._lock:
            return len(self.by_id.get(rid, ()))

    def get(self, rid: str) -> list[codec.TensorResponse]:
        with self._lock:
            return list(self.by_id.get(rid, ()))


class Host:
    """The runtime host in its own process, and this process's endpoints to it."""

    def __init__(self, proc: NodeProcess, h: RosHarness):
        self.proc, self.h = proc, h
        self.tester = h.node("fuzz_tester")
        self.answers = Answers()
        self.sub = self.tester.create_subscription(UInt8MultiArray, RESPONSE_TOPIC,
                                                   self.answers, REQUEST_QOS)
        self.pub = self.tester.create_publisher(UInt8MultiArray, REQUEST_TOPIC, REQUEST_QOS)
        self.models: list[dict[str, Any]] = []
        self.tester.create_subscription(String, MODELS_TOPIC,
                                        lambda m: self.models.append(json.loads(m.data)),
                                        LATCHED_QOS)
        self._diag_lock = threading.Lock()
        self.diag: dict[str, str] = {}
        self.diag_statuses = 0
        self.tester.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)
        #: tallies over every fuzz batch
        self.sent = 0
        self.sent_no_id = 0
        self.codes: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()  # what the cases varied (first word of each)
        self.max_bytes = 0

    def _on_diag(self, msg: DiagnosticArray) -> None:
        for s in msg.status:
            if s.name == "av_infer: runtime":
                with self._diag_lock:
                    self.diag = {kv.key: kv.value for kv in s.values}
                    self.diag_statuses = len(msg.status)

    def diagnostics(self) -> dict[str, str]:
        with self._diag_lock:
            return dict(self.diag)

    def alive(self) -> bool:
        return self.proc.alive()

    def wait(self, pred, what: str) -> None:
        """Waits for ``pred`` (a hang guard); fails at once, with the log, if the host died."""
        try:
            wait_for(lambda: pred() or not self.alive(), what=what)
        except TimeoutError:
            pass  # the caller's assertion says what is missing
        assert self.alive(), f"the runtime host died:\n{self.proc.output()[-4000:]}"

    def valid_request(self) -> str:
        rid = f"valid-{uuid.uuid4()}"
        x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
        self.pub.publish(to_msg(*codec.encode_request(codec.TensorRequest(
            id=rid, model=MODEL, priority="RT", inputs={INPUT: x}, deadline_s=WAIT_S,
            client="fuzz_final"))))
        return rid


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    logs = tmp_path_factory.mktemp("ros_fuzz_logs")
    proc = NodeProcess("av_infer_nodes.runtime_node", log_dir=logs, ros_args=[
        "-p", "device:=cpu", "-p", f"models:=[{MODEL}]", "-p", "diagnostics_period_s:=0.5"])
    h = RosHarness()
    try:
        hst = Host(proc, h)
        hst.wait(lambda: hst.models and hst.pub.get_subscription_count() > 0
                 and hst.sub.get_publisher_count() > 0, "the host's model table and topics")
        assert hst.models, "no model table from the host"
        inputs = hst.models[-1]["models"][MODEL]["inputs"]
        assert inputs == {INPUT: {"shape": SHAPE, "dtype": DTYPE}}, inputs  # what cases assume
        yield hst
    finally:
        h.close()
        code = proc.stop()
        print(f"--- runtime host ---\n{proc.output()[-3000:]}")
        assert code == 0, code  # alive to the end, clean exit on SIGINT


def _case(what: str, tensors: list[tuple[str, str, list[int]]] | None = None,
          **kw: Any) -> Case:
    """An explicit case: a valid request with ``kw`` changed (header fields, or Case
    fields where they are Case fields)."""
    header = {"v": 1, "model": MODEL, "priority": "RT", "deadline_s": WAIT_S}
    fields = {k: kw.pop(k) for k in list(kw) if k in Case.__dataclass_fields__}
    header.update(kw)
    return Case(header=header, tensors=tensors or [(INPUT, DTYPE, SHAPE)], seed=0,
                what=[what], **fields)


#: run first in every run, whatever the seed: what the fuzz found once, and the extremes
REGRESSION_BATCH = [
    _case("valid"),
    _case("deadline 10**400 (finding 1)", deadline_s=10**400, malformed=True),
    _case("deadline -10**400", deadline_s=-(10**400), malformed=True),
    _case("zero-size shape numpy refuses (finding 2)",
          tensors=[(INPUT, "int16", [2**20, 2**20, 0, 2**20, 2**20])]),
    _case("client/frame_id lone surrogates (the host died publishing /diagnostics)",
          client="a\udfffb", frame_id="\ud800"),
    _case("deadline NaN", deadline_s=math.nan, malformed=True),
    _case("deadline inf", deadline_s=math.inf, malformed=True),
    _case("deadline -1", deadline_s=-1, malformed=True),
    _case("deadline tiny, drop_late", deadline_s=1e-300, drop_late=True),
    _case("stamp in 1970, drop_late", stamp=[1, 0], deadline_s=0.001, drop_late=True),
    _case("id of MAX_ID_LEN", id_kind="max"),
    _case("id too long", id_kind="too_long", id=("x" * (codec.MAX_ID_LEN + 1))),
    _case("MAX_TENSORS tensors", tensors=[(f"t{i}", "uint8", [1]) for i in range(64)]),
    _case("rank MAX_RANK", tensors=[(INPUT, DTYPE, [1] * codec.MAX_RANK)]),
    _case("MAX_BYTES payload", tensors=[(INPUT, "uint8", [MAX_BYTES])]),
    _case("label without dims", label_mutation=("nodims", None)),
    _case("label deeply nested", label_mutation=("garbage", "[" * 100_000 + "]" * 100_000)),
]


def _settings(examples: int):
    s = settings(max_examples=examples, deadline=None, database=None,
                 derandomize=FUZZ_SEED is None, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=list(HealthCheck), print_blob=True)
    return s


def test_fuzzed_requests_each_answered_once(host):
    examples = max(1, math.ceil(N_REQUESTS / BATCH))
    answers = host.answers
    empty_expected = [0]

    def check_batch(batch: list[Case]) -> None:
        built = [build(c) for c in batch]
        for b in built:
            host.pub.publish(b.msg)
            host.sent += 1
            host.max_bytes = max(host.max_bytes, len(b.msg.data))
            host.kinds.update({w.split(" ")[0] for w in b.case.what} or {"valid"})
        with_id = [b for b in built if b.rid]
        empty_expected[0] += len(built) - len(with_id)
        host.sent_no_id += len(built) - len(with_id)
        host.wait(lambda: all(answers.count(b.rid) for b in with_id)
                  and answers.count("") >= empty_expected[0], f"{len(built)} answers")
        missing = [b.case for b in with_id if not answers.count(b.rid)]
        assert not missing, f"never answered: {missing}"
        assert answers.count("") >= empty_expected[0], \
            f"{answers.count('')} of {empty_expected[0]} id-less requests answered"
        assert not answers.undecodable, answers.undecodable
        for b in with_id:
            got = answers.get(b.rid)
            assert len(got) == 1, (b.case, [(r.code, r.message) for r in got])
            r = got[0]
            host.codes[r.code] += 1
            assert r.code in CODES, (b.case, r.code, r.message)  # typed, never internal_error
            assert r.code in b.expect, (b.case, sorted(b.expect), r.code, r.message)
            assert r.ok == (r.code == "ok"), (b.case, r.ok, r.code)
            if r.ok:
                assert list(r.outputs) == ["logits"], b.case
                assert r.outputs["logits"].shape == (1, 10), b.case
            else:
                assert not r.outputs and r.message, (b.case, r.message)
            if b.echo is not None and r.code != codec.MALFORMED:  # decoded: header echoed
                assert (r.client, r.frame_id, r.stamp) == (
                    b.echo["client"], b.echo["frame_id"], b.echo["stamp"]), b.case

    @_settings(examples)
    @given(st.lists(fuzz_case(), min_size=BATCH, max_size=BATCH))
    @example(REGRESSION_BATCH)
    def run(batch: list[Case]) -> None:
        check_batch(batch)

    if FUZZ_SEED is not None:
        run = hypothesis_seed(int(FUZZ_SEED))(run)
    run()
    # a sentinel: answered after everything before it, so a late duplicate shows up now
    rid = host.valid_request()
    host.wait(lambda: answers.count(rid), "the final valid request")
    final = answers.get(rid)
    assert len(final) == 1 and final[0].ok, [(r.code, r.message) for r in final]
    assert final[0].outputs["logits"].shape == (1, 10)
    empty = answers.get("")
    host.codes[f"{codec.MALFORMED} (id \"\")"] += len(empty)
    dups = {k: len(v) for k, v in answers.by_id.items() if k and len(v) > 1}
    # answered with their id although the codec raised something else than CodecError
    salvaged = sum(r.message.startswith("undecodable") for k, v in answers.by_id.items()
                   if k for r in v)
    print(f"\nfuzz: sent {host.sent} ({host.sent_no_id} without a usable id), answered "
          f"{answers.total - 1}, duplicates {dups or 0}, by code {dict(host.codes)}\n"
          f"cases varied: {dict(host.kinds.most_common())}\n"
          f"answered with their id after a non-CodecError: {salvaged}; /diagnostics "
          f"statuses: {host.diag_statuses}; largest payload {host.max_bytes} bytes")
    assert host.sent >= N_REQUESTS, host.sent
    assert not dups, dups
    assert len(empty) == host.sent_no_id, (len(empty), host.sent_no_id)
    assert all(r.code == codec.MALFORMED for r in empty), {r.code for r in empty}
    assert answers.total - 1 == host.sent
    # the host counted what reached its runtime (/diagnostics: submit_errors.<code>)
    want = {f"submit_errors.{c}": str(host.codes[c]) for c in ("unknown_model",
                                                                "invalid_input")}

    def diag_agrees() -> bool:
        d = host.diagnostics()
        return all(d.get(k, "0") == v for k, v in want.items())

    host.wait(diag_agrees, "/diagnostics counting the refused submits")
    got = {k: host.diagnostics().get(k, "0") for k in want}
    assert got == want, (got, want)


def _cdr_garbage() -> list[bytes]:
    """Serialized UInt8MultiArray messages broken below the message level."""
    x = np.zeros(SHAPE, np.float32)
    label, data = codec.encode_request(codec.TensorRequest(
        id="cdr", model=MODEL, priority="RT", inputs={INPUT: x}))
    raw = serialize_message(to_msg(label, data))
    rng = np.random.default_rng(7)
    out = [raw[:4], raw[:10], raw[: len(raw) // 2], raw[:-1], b"\x00\x01\x00\x00",
           b"\x00\x01\x00\x00" + b"\xff\xff\xff\x7f" + b"junk", rng.bytes(64),
           b"\x00\x01\x00\x00" + rng.bytes(4096)]
    bad_label = UInt8MultiArray()
    bad_label.layout.dim = [MultiArrayDimension(label="Q" * 16)]
    out.append(serialize_message(bad_label).replace(b"Q" * 16, b"\xff\xfe\x80{" * 4))
    return out


def test_undeserializable_messages_do_not_hurt_the_host(host):
    """Bytes that are no UInt8MultiArray are dropped by the middleware (nothing to answer);
    those that deserialize (invalid UTF-8 in the label is replaced) are answered with id
    ""; either way the host keeps serving."""
    answers = host.answers
    before = answers.count("")
    garbage = _cdr_garbage()
    for raw in garbage:
        host.pub.publish(raw)
    rid = host.valid_request()
    host.wait(lambda: answers.count(rid), "a valid request after CDR garbage")
    got = answers.get(rid)
    assert len(got) == 1 and got[0].ok, [(r.code, r.message) for r in got]
    assert answers.count("") - before <= len(garbage)
    assert all(r.code == codec.MALFORMED for r in answers.get("")[before:])
    assert host.alive()


def test_huge_integer_deadline_is_a_codec_error():
    """Finding (/tmp/coord/findings.md R1): a JSON integer deadline too large for a float
    raises OverflowError from ``decode_request`` instead of a CodecError carrying the id,
    so the host answers it with ``id ""`` and the client never gets its answer."""
    label = json.dumps({"v": 1, "id": "big-deadline", "model": MODEL, "priority": "RT",
                        "deadline_s": 10**400, "tensors": []})
    with pytest.raises(codec.CodecError) as err:
        codec.decode_request(label, b"")
    assert err.value.request_id == "big-deadline"


def test_zero_size_shape_numpy_cannot_make_is_a_codec_error():
    """Finding (/tmp/coord/findings.md R2): a zero-size shape (so ``nbytes`` 0 is right)
    whose other dimensions overflow numpy's size makes ``unpack_tensors`` raise numpy's
    ValueError instead of a CodecError carrying the id."""
    spec = [{"name": INPUT, "dtype": "int16", "shape": [2**20, 2**20, 0, 2**20, 2**20],
             "offset": 0, "nbytes": 0}]
    with pytest.raises(codec.CodecError) as err:
        codec.unpack_tensors(spec, b"", "zero-size")
    assert err.value.request_id == "zero-size"
