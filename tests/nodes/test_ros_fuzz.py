"""Fuzz of the request topic: hypothesis-generated ``av_infer_msgs/InferRequest`` messages
published on /av_infer/request to a runtime host in its own process; every one is answered
exactly once, with the expected typed status, and the process stays alive and serving.

What is generated (``fuzz_case``): valid requests (normal and random-bit inputs, NaN/inf
values included) and every field varied within what the message types can carry: ids
(UUID-like, unicode, exactly ``MAX_ID_LEN``, and unusable ones: empty, too long), models
(unknown, empty), priorities (any int8), deadlines (negative seconds, nanoseconds out of
range, zero, tiny, huge), hard deadlines (the same, and before the soft one), variant
groups (unknown, too long), ``drop_late``, clients and frame ids (empty, unicode, very long),
stamps (zero, far past, far future); tensors that pass the metadata checks but do not fit
the model (any data type, rank 0..``MAX_RANK``, wrong and extra names) and ones the host
must refuse before allocating: a count over ``max_request_tensors``, a declared size over
``max_request_mb`` (up to 2^32 per dimension: never allocated), rank over ``MAX_RANK``,
unknown data types, empty or duplicate names, non-contiguous strides, data that does not
match shape x type. Each case carries the status it must get (``expected``), derived from
the documented check order, not from the codec.

Checked: each request with a usable id gets exactly one response with its id and expected
code; requests without a usable id are answered with id "" (as many as were sent); error
responses carry no tensors; a valid request still succeeds at the end and the process is
alive. Bytes that are no request (CDR garbage, cut messages) are answered once each without
an id and do not hurt it (``test_bytes_that_are_no_request_are_answered_and_do_not_hurt_the_host``).

Size: ``AV_INFER_FUZZ_N`` requests (default 300; ``make soak`` runs 10,000), sent in
batches of ``BATCH`` and answered before the next batch (the topics are reliable with a
depth of 64). Seeded (derandomized) unless ``AV_INFER_FUZZ_SEED`` is set. Waits are hang
guards (``WAIT_S``), never timings.

Run inside scripts/netns_run.sh (make test does): LOCALHOST discovery, fresh netns.
"""

from __future__ import annotations

import math
import os
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")
hypothesis = pytest.importorskip("hypothesis")

from av_infer_msgs.msg import InferRequest, InferResponse, Tensor, TensorShape  # noqa: E402
from av_infer_nodes.common import REQUEST_QOS, REQUEST_TOPIC, RESPONSE_TOPIC  # noqa: E402
from av_infer_nodes.testing import (  # noqa: E402
    NodeProcess,
    RosHarness,
    wait_for,
)
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from rclpy.serialization import serialize_message  # noqa: E402

from av_infer import tensor_codec as codec  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.timeout(3600)]  # a hang guard

N_REQUESTS = int(os.environ.get("AV_INFER_FUZZ_N", "300"))
FUZZ_SEED = os.environ.get("AV_INFER_FUZZ_SEED")
BATCH = 20
MODEL, INPUT, SHAPE, DTYPE = "tiny_cnn", "input", [1, 3, 32, 32], "float32"
MAX_ID_LEN = codec.DEFAULT_LIMITS.max_id_len
MAX_RANK = codec.DEFAULT_LIMITS.max_rank
#: the host's bounds (its parameters below): small, so refusals are cheap to provoke
MAX_TENSORS, MAX_MB = 4, 1
MAX_BYTES = MAX_MB * 2**20
TOO_LARGE = "request_too_large"


@dataclass
class TensorCase:
    name: str
    data_type: int
    shape: list[int]
    #: bytes actually sent (None: exactly shape x type, random content)
    data_len: int | None = None
    strides: list[int] | None = None
    nan: bool = False


@dataclass
class Case:
    """One request and the codes it may get (a set: where timing decides, e.g. a tiny
    deadline with drop_late, both answers are right)."""

    id: str
    model: str = MODEL
    priority: int = 0
    deadline: tuple[int, int] = (0, 0)
    drop_late: bool = False
    hard_deadline: tuple[int, int] = (0, 0)
    variant_group: str = ""
    client: str = "fuzz"
    frame_id: str = ""
    stamp: tuple[int, int] = (0, 0)
    tensors: list[TensorCase] = field(default_factory=list)
    expected: frozenset[str] = frozenset()
    kind: str = "valid"

    def __repr__(self) -> str:  # hypothesis prints falsifying batches: keep them short
        return f"Case({self.kind}, id={self.id[:20]!r}, expected={sorted(self.expected)})"


def _itemsize(code: int) -> int:
    return codec.DATA_TYPES[code].itemsize if code in codec.DATA_TYPES else 1


def _tensor_failure(tensors: list[TensorCase]) -> str | None:
    """The documented order of the host's metadata checks (tensor_codec.check_tensors)."""
    if len(tensors) > MAX_TENSORS:
        return TOO_LARGE
    seen: set[str] = set()
    total = 0
    for t in tensors:
        if not t.name or t.name in seen:
            return codec.MALFORMED
        seen.add(t.name)
        if t.data_type not in codec.DATA_TYPES:
            return codec.MALFORMED
        if len(t.shape) > MAX_RANK:
            return TOO_LARGE
        nbytes = math.prod(t.shape) * _itemsize(t.data_type)
        if nbytes > MAX_BYTES:
            return TOO_LARGE
        total += nbytes
        if total > MAX_BYTES:
            return TOO_LARGE
        if t.strides and t.strides != codec.contiguous_strides(t.shape,
                                                               _itemsize(t.data_type)):
            return codec.MALFORMED
        if t.data_len is not None and t.data_len != nbytes:
            return codec.MALFORMED
    return None


def expected_codes(c: Case) -> frozenset[str]:
    """Control fields first, then tensor metadata, then the model, then its input spec."""
    if not c.id or len(c.id) > MAX_ID_LEN or not c.model or c.priority not in (0, 1) \
            or any(d[0] < 0 or not 0 <= d[1] < 1_000_000_000
                   for d in (c.deadline, c.hard_deadline)) \
            or len(c.variant_group) > MAX_ID_LEN:
        return frozenset({codec.MALFORMED})
    bad = _tensor_failure(c.tensors)
    if bad is not None:
        return frozenset({bad})
    if c.model != MODEL:
        return frozenset({"unknown_model"})
    fits = (len(c.tensors) == 1 and c.tensors[0].name == INPUT
            and c.tensors[0].data_type == codec.DATA_TYPE_OF[DTYPE]
            and c.tensors[0].shape == SHAPE)
    if not fits:
        return frozenset({"invalid_input"})
    if c.variant_group:  # the host defines no groups
        return frozenset({"unknown_model"})
    has_deadline = c.deadline != (0, 0)
    if c.hard_deadline != (0, 0):
        if has_deadline and c.hard_deadline < c.deadline:
            return frozenset({"invalid_parameter"})
        # from receipt, a few seconds: a BE request is dropped if the host is that slow
        return frozenset({"ok", "deadline_missed"})
    if c.drop_late and has_deadline:
        if c.stamp == (1, 0):  # due decades ago
            return frozenset({"deadline_missed"})
        if c.stamp == (0, 0) and c.deadline[0] < 60:  # from receipt: timing decides
            return frozenset({"ok", "deadline_missed"})
    return frozenset({"ok"})


def build(c: Case, rng: np.random.Generator) -> InferRequest:
    msg = InferRequest(id=c.id, model=c.model, priority=c.priority, drop_late=c.drop_late,
                       client=c.client, variant_group=c.variant_group)
    msg.deadline.sec, msg.deadline.nanosec = c.deadline
    msg.hard_deadline.sec, msg.hard_deadline.nanosec = c.hard_deadline
    msg.header.stamp.sec, msg.header.stamp.nanosec = c.stamp
    msg.header.frame_id = c.frame_id
    for t in c.tensors:
        tm = Tensor(name=t.name, data_type=t.data_type,
                    shape=TensorShape(rank=len(t.shape), dims=t.shape))
        n = t.data_len
        if n is None:
            n = math.prod(t.shape) * _itemsize(t.data_type)
        if n <= MAX_BYTES + 64:  # a declared size over the bound is never sent
            raw = rng.bytes(n)
            if t.nan and t.data_type == codec.DATA_TYPE_OF["float32"] and n >= 8:
                raw = np.array([np.nan, np.inf], np.float32).tobytes() + raw[8:]
            tm.data = raw
        if t.strides is not None:
            tm.strides = t.strides
        msg.tensors.append(tm)
    return msg


# -- strategies ------------------------------------------------------------------------------
_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
                max_size=40)
_DATA_TYPES = sorted(codec.DATA_TYPES)


@st.composite
def tensor_case(draw) -> TensorCase:
    code = draw(st.sampled_from(_DATA_TYPES + [0, 14, 127, -1, 2**31 - 1]))
    rank = draw(st.integers(0, MAX_RANK + 2))
    big = draw(st.integers(0, 9)) == 0
    dims = st.integers(0, 2**32 - 1) if big else st.integers(0, 6)
    shape = draw(st.lists(dims, min_size=rank, max_size=rank))
    name = draw(st.sampled_from([INPUT, "mask", "", "x" * 300]) | _text)
    t = TensorCase(name=name, data_type=code, shape=shape)
    fault = draw(st.integers(0, 9))
    nbytes = math.prod(shape) * _itemsize(code)
    if fault == 0 and nbytes <= MAX_BYTES:
        t.data_len = max(0, nbytes + draw(st.sampled_from([-1, 1, 7, -nbytes])))
    elif fault == 1 and shape:
        t.strides = draw(st.lists(st.integers(0, 64), min_size=rank, max_size=rank))
    elif fault == 2 and nbytes < 2**63:
        t.strides = codec.contiguous_strides(shape, _itemsize(code))  # explicit: fine
    return t


@st.composite
def fuzz_case(draw) -> Case:
    kind = draw(st.sampled_from(["valid", "valid", "valid", "id", "model", "priority",
                                 "deadline", "stamp", "strings", "tensors", "tensors",
                                 "count", "qos"]))
    c = Case(id=f"f-{uuid.uuid4()}", kind=kind,
             tensors=[TensorCase(INPUT, codec.DATA_TYPE_OF[DTYPE], list(SHAPE),
                                 nan=draw(st.booleans()))])
    c.priority = draw(st.sampled_from([0, 1]))
    if draw(st.booleans()):
        c.deadline = (draw(st.integers(0, 5)), draw(st.integers(0, 999_999_999)))
        c.drop_late = draw(st.booleans())
    if kind == "id":
        # unusable (answered with id ""), exactly MAX_ID_LEN, or unicode; usable ids unique
        c.id = draw(st.sampled_from(["", "x" * (MAX_ID_LEN + 1),
                                     "y" * (MAX_ID_LEN - 32) + uuid.uuid4().hex])
                    | _text.map(lambda s: s + "-" + uuid.uuid4().hex))
    elif kind == "model":
        c.model = draw(st.sampled_from(["", "no_such_model", MODEL.upper()]) | _text)
    elif kind == "priority":
        c.priority = draw(st.integers(-128, 127))
    elif kind == "deadline":
        c.deadline = (draw(st.integers(-(2**31), 2**31 - 1)), draw(st.integers(0, 2**32 - 1)))
        c.drop_late = draw(st.booleans())
    elif kind == "stamp":
        c.stamp = draw(st.sampled_from([(1, 0), (2**31 - 1, 999_999_999)]))
        c.deadline = (0, draw(st.integers(1, 999_999_999)))
        c.drop_late = draw(st.booleans())
    elif kind == "strings":
        c.client = draw(_text | st.just("c" * 5000))
        c.frame_id = draw(_text | st.just("f" * 5000))
    elif kind == "tensors":
        c.tensors = draw(st.lists(tensor_case(), min_size=0, max_size=MAX_TENSORS))
    elif kind == "qos":  # paper 001's fields: the hard deadline and the variant group
        c.hard_deadline = draw(st.sampled_from([(0, 0), (-1, 0), (0, 10**9)])
                               | st.tuples(st.integers(0, 5), st.integers(0, 999).map(
                                   lambda ms: ms * 1_000_000)))
        c.variant_group = draw(st.sampled_from(["", "", "nope", "g" * (MAX_ID_LEN + 1)]))
    elif kind == "count":
        c.tensors = [TensorCase(f"t{i}", 2, [1]) for i in range(
            draw(st.integers(MAX_TENSORS + 1, 3 * MAX_TENSORS)))]
    c.expected = expected_codes(c)
    return c


class Answers:
    """Responses by id (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_id: dict[str, list[InferResponse]] = {}

    def __call__(self, msg: InferResponse) -> None:
        with self._lock:
            self.by_id.setdefault(msg.id, []).append(msg)

    def count(self, rid: str) -> int:
        with self._lock:
            return len(self.by_id.get(rid, []))

    def get(self, rid: str) -> list[InferResponse]:
        with self._lock:
            return list(self.by_id.get(rid, []))


class Host:
    """The runtime host in its own process, and this process's endpoints to it."""

    def __init__(self, proc: NodeProcess, h: RosHarness):
        self.proc = proc
        self.tester = h.node("fuzz_tester")
        self.answers = Answers()
        self.sub = self.tester.create_subscription(InferResponse, RESPONSE_TOPIC,
                                                   self.answers, REQUEST_QOS)
        self.pub = self.tester.create_publisher(InferRequest, REQUEST_TOPIC, REQUEST_QOS)
        self.codes: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()

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
        c = Case(id=rid, tensors=[TensorCase(INPUT, codec.DATA_TYPE_OF[DTYPE], list(SHAPE))])
        self.pub.publish(build(c, np.random.default_rng(1)))
        return rid


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    logs = tmp_path_factory.mktemp("ros_fuzz_logs")
    proc = NodeProcess("av_infer_nodes.runtime_node", log_dir=logs, ros_args=[
        "-p", "device:=cpu", "-p", f"models:=[{MODEL}]",
        "-p", f"max_request_tensors:={MAX_TENSORS}", "-p", f"max_request_mb:={MAX_MB}",
        # every answer on the one shared topic: the fuzzed client ids would each get a
        # topic of their own (per-client routing: test_ros_routing)
        "-p", "response_routing:=shared"])
    h = RosHarness()
    try:
        hst = Host(proc, h)
        hst.wait(lambda: hst.pub.get_subscription_count() > 0
                 and hst.sub.get_publisher_count() > 0, "the host's topics")
        # the host is ready when a valid request is answered
        rid = hst.valid_request()
        hst.wait(lambda: hst.answers.count(rid), "the first valid answer")
        assert hst.answers.get(rid)[0].code == "ok"
        yield hst
    finally:
        h.close()
        code = proc.stop()
        print(f"--- runtime host ---\n{proc.output()[-3000:]}")
        assert code == 0, code  # alive to the end, clean exit on SIGINT


def _settings(examples: int):
    return settings(max_examples=examples, deadline=None, database=None,
                    derandomize=FUZZ_SEED is None, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck), print_blob=True)


def test_fuzzed_requests_each_answered_once(host):
    examples = max(1, math.ceil(N_REQUESTS / BATCH))
    answers = host.answers
    rng = np.random.default_rng(int(FUZZ_SEED or 0))
    no_id = [0]
    empty_before = answers.count("")  # another test's (bytes that are no request)

    def run(batch: list[Case]) -> None:
        before_empty = answers.count("")
        for c in batch:
            host.pub.publish(build(c, rng))
            host.kinds[c.kind] += 1
        with_id = [c for c in batch if c.id and len(c.id) <= MAX_ID_LEN]
        n_empty = len(batch) - len(with_id)
        no_id[0] += n_empty
        host.wait(lambda: all(answers.count(c.id) for c in with_id)
                  and answers.count("") >= before_empty + n_empty, "a batch's answers")
        for c in with_id:
            got = answers.get(c.id)
            assert len(got) == 1, (c, [(r.code, r.message) for r in got])
            r = got[0]
            assert r.code in c.expected, (c, r.code, r.message)
            assert r.status == codec.status_of(r.code)
            assert r.code == "ok" or not r.tensors
            host.codes[r.code] += 1

    given(st.lists(fuzz_case(), min_size=BATCH, max_size=BATCH))(
        _settings(examples)(run))()
    empty = answers.get("")[empty_before:]
    assert len(empty) == no_id[0], (len(empty), no_id[0])  # each answered once
    assert all(r.code == codec.MALFORMED for r in empty)
    rid = host.valid_request()
    host.wait(lambda: answers.count(rid), "a valid request after the fuzz")
    assert answers.get(rid)[0].code == "ok"
    print(f"fuzz: {sum(host.kinds.values())} requests, kinds {dict(host.kinds)}, "
          f"codes {dict(host.codes)}, {no_id[0]} without a usable id")


def test_bytes_that_are_no_request_are_answered_and_do_not_hurt_the_host(host):
    """The host reads requests from their bytes (a raw subscription): bytes that are no
    InferRequest are answered once each, ``malformed_request`` without an id on the shared
    topic, saying which field ran past the end; a cut that removed only trailing bytes
    still is the request (answered under its id); the host keeps serving."""
    c = Case(id="cdr", tensors=[TensorCase(INPUT, codec.DATA_TYPE_OF[DTYPE], list(SHAPE))])
    raw = serialize_message(build(c, np.random.default_rng(3)))
    rng = np.random.default_rng(7)
    bad = [raw[:4], raw[:10], raw[: len(raw) // 2], raw[:-1], b"\x00\x01\x00\x00",
           b"\x00\x01\x00\x00" + b"\xff\xff\xff\x7f" + b"junk", rng.bytes(64),
           b"\x00\x01\x00\x00" + rng.bytes(4096)]

    def is_request(b: bytes) -> bool:
        try:
            codec.read_infer_request(b)
        except ValueError:
            return False
        return True

    no_request = sum(not is_request(b) for b in bad)
    assert no_request >= 6
    empty_before, cdr_before = host.answers.count(""), host.answers.count("cdr")
    for b in bad:
        host.pub.publish(b)
    host.wait(lambda: host.answers.count("") >= empty_before + no_request
              and host.answers.count("cdr") >= cdr_before + len(bad) - no_request,
              "the answers to bytes that are no request")
    rid = host.valid_request()
    host.wait(lambda: host.answers.count(rid), "a valid request after CDR garbage")
    got = host.answers.get(rid)
    assert len(got) == 1 and got[0].code == "ok", [(r.code, r.message) for r in got]
    empty = host.answers.get("")[empty_before:]
    assert len(empty) == no_request
    assert all(r.code == codec.MALFORMED and "not an InferRequest" in r.message
               and "InferRequest" in r.message for r in empty)
    assert host.answers.count("cdr") == cdr_before + len(bad) - no_request
    assert host.alive()
