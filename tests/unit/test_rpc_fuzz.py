"""Property-based fuzzing of every RPC of a real controller process over real gRPC.

Hypothesis draws, for every method of every service in garrison.v1 (found from the generated descriptors,
so RPCs added later are fuzzed too): random messages built from the field types, mutations of valid
requests (so validation is reached field by field), undecodable bytes, and messages over gRPC's size limit,
sent as an admin (root's local credential), as a non-admin (a token for nobody), with no identity, and
with garbage credentials and tokens. The agent stream gets random first messages and random traffic after
a valid Register.

Every answer must be a clear refusal (INVALID_ARGUMENT, PERMISSION_DENIED, UNAUTHENTICATED, NOT_FOUND,
or RESOURCE_EXHAUSTED for a message over the transport limit) or a success; never INTERNAL/UNKNOWN, never
a silent hang. Afterwards the controller must still serve, must have logged no internal error, and its
store must hold only what validation accepts, and must load again in a new controller process.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as pbd
from google.protobuf import message_factory
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from security_helpers import running_controller

import garrison.protos.v1 as protos_package
from garrison.config import load_config
from garrison.controller.limits import NODE_NAME
from garrison.controller.store import open_store
from garrison.controller.validate import validate_submission
from garrison.model.domain import Principal
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.protos.v1 import garrison_pb2_grpc as pb_grpc
from garrison.protos.v1 import security_pb2 as spb
from garrison.protos.v1 import security_pb2_grpc as spb_grpc

TRANSPORT_LIMIT = 4 * 1024 * 1024  # gRPC's default largest message
METADATA_LIMIT = 8 * 1024  # gRPC's default soft limit on a request's metadata
CLEAR_REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.NOT_FOUND,
    # Admin RPCs of other areas may also say a thing exists already, or cannot be done in this state.
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
}
MAX_DETAILS_CHARS = 1000
FUZZ_DEADLINE_S = 10.0

# Strings that have broken parsers, paths and logs elsewhere.
NASTY_STRINGS = [
    "", " ", "\x00", "a\x00b", "\n", "x\ny", "\t", "../../etc/passwd", "/etc/shadow", "/root/.ssh/id_rsa",
    "%j%t%n%A%a%u%x%%", "%", "1", "0", "-1", "1_2", "1__2", "_", "18446744073709551616", "9" * 40,
    "PENDING", "RUNNING", "all", "root", "nobody", "default", "main", "node1", "rank", "single", "node",
    "é", "\u202e", "\U0001f600", "\ufeff", "a" * 129, "a" * 5000, "x" * 70_000, "garrison-controller",
    "v1.e30.x", "t1.e30.x", "' OR 1=1 --", "${HOME}", "$(reboot)", "`id`",
]


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    path: str
    request: type[Message]
    client_streaming: bool
    server_streaming: bool


def discover_methods() -> list[Method]:
    """Every RPC of every garrison.v1 service, from the generated descriptors."""
    methods: list[Method] = []
    for module_info in pkgutil.iter_modules(protos_package.__path__):
        if not module_info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"{protos_package.__name__}.{module_info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                methods.append(
                    Method(
                        service=service.full_name,
                        name=method.name,
                        path=f"/{service.full_name}/{method.name}",
                        request=message_factory.GetMessageClass(method.input_type),
                        client_streaming=method.client_streaming,
                        server_streaming=method.server_streaming,
                    )
                )
    return sorted(methods, key=lambda m: m.path)


METHODS = discover_methods()
UNARY = [m for m in METHODS if not m.client_streaming and not m.server_streaming]

# Valid requests to mutate, so that fuzzing gets past the first check to every later one.
VALID: dict[str, Message] = {
    "/garrison.v1.Controller/SubmitJob": pb.SubmitJobRequest(
        spec=pb.JobSpec(name="fuzz", command=["true"], workdir="/tmp", gpus=1, time_limit_s=60)
    ),
    "/garrison.v1.Controller/CancelJobs": pb.CancelJobsRequest(job_ids=["1"]),
    "/garrison.v1.Controller/ListJobs": pb.ListJobsRequest(states=["PENDING"]),
    "/garrison.v1.Controller/GetJob": pb.GetJobRequest(job_id="1"),
    "/garrison.v1.Security/IssueToken": spb.IssueTokenRequest(user="nobody", lifetime_s=60),
    "/garrison.v1.Security/RevokeTokens": spb.RevokeTokensRequest(user="nobody"),
}


# --------------------------------------------------------------------------------- strategies

INT_RANGES = {
    pbd.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    pbd.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    pbd.FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    pbd.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    pbd.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    pbd.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    pbd.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    pbd.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    pbd.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    pbd.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}

strings = st.one_of(st.text(max_size=40), st.sampled_from(NASTY_STRINGS))


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in (low, high, 0, 1, -1, 2**31 - 1, 2**32 - 1, 2**63 - 1) if low <= v <= high]
    return st.one_of(st.integers(min_value=max(low, -5), max_value=min(high, 100)), st.sampled_from(edges),
                     st.integers(min_value=low, max_value=high))


def scalar(field: pbd.FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == pbd.FieldDescriptor.TYPE_STRING:
        return strings
    if kind == pbd.FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == pbd.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (pbd.FieldDescriptor.TYPE_DOUBLE, pbd.FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if kind == pbd.FieldDescriptor.TYPE_DOUBLE else 32)
    if kind == pbd.FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in list(field.enum_type.values)]), _integers(-3, 1000))
    low, high = INT_RANGES[kind]
    return _integers(low, high)


def _is_map(field: pbd.FieldDescriptor) -> bool:
    return field.type == pbd.FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


@st.composite
def messages(draw: st.DrawFn, descriptor: pbd.Descriptor, depth: int = 0) -> Message:
    """A message of ``descriptor`` with a random subset of its fields set to random values."""
    message = message_factory.GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        if _is_map(field):
            key_field, value_field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            if value_field.type == pbd.FieldDescriptor.TYPE_MESSAGE:
                continue
            entries = draw(st.dictionaries(scalar(key_field), scalar(value_field), max_size=5))
            getattr(message, field.name).update(entries)
        elif field.type == pbd.FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            if field.is_repeated:
                for item in draw(st.lists(messages(field.message_type, depth + 1), max_size=3)):
                    getattr(message, field.name).add().CopyFrom(item)
            else:
                getattr(message, field.name).CopyFrom(draw(messages(field.message_type, depth + 1)))
        elif field.is_repeated:
            getattr(message, field.name).extend(draw(st.lists(scalar(field), max_size=5)))
        else:
            setattr(message, field.name, draw(scalar(field)))
    return message


@st.composite
def mutated(draw: st.DrawFn, base: Message) -> Message:
    """``base`` with one to three of its (nested) fields replaced by random values."""
    message = type(base)()
    message.CopyFrom(base)
    for _ in range(draw(st.integers(1, 3))):
        target = message
        descriptor = message.DESCRIPTOR
        field = draw(st.sampled_from(list(descriptor.fields)))
        # Step into a set sub-message now and then (JobSpec inside SubmitJobRequest).
        if field.type == pbd.FieldDescriptor.TYPE_MESSAGE and not _is_map(field) and not field.is_repeated and draw(st.booleans()):
            target = getattr(message, field.name)
            field = draw(st.sampled_from(list(target.DESCRIPTOR.fields)))
        replacement = draw(messages(target.DESCRIPTOR))
        target.ClearField(field.name)
        if field.is_repeated:  # maps included
            getattr(target, field.name).MergeFrom(getattr(replacement, field.name))
        elif field.type == pbd.FieldDescriptor.TYPE_MESSAGE:
            if replacement.HasField(field.name):
                getattr(target, field.name).CopyFrom(getattr(replacement, field.name))
        elif not field.has_presence or replacement.HasField(field.name):
            setattr(target, field.name, getattr(replacement, field.name))
    return message


@st.composite
def payloads(draw: st.DrawFn, method: Method) -> tuple[bytes, str]:
    """(serialized request, what kind of input it is)."""
    kind = draw(st.sampled_from(["random", "random", "mutated", "bytes", "truncated"]))
    if kind == "mutated" and method.path in VALID:
        return draw(mutated(VALID[method.path])).SerializeToString(), kind
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=200)), kind
    message = draw(messages(method.request.DESCRIPTOR))
    data = message.SerializeToString()
    if kind == "truncated" and len(data) > 1:
        return data[: draw(st.integers(1, len(data) - 1))], kind
    return data, "random"


# --------------------------------------------------------------------------------- the controller


@dataclass
class Fuzzed:
    controller: Any
    channel: grpc.Channel
    admin: tuple[tuple[str, str], ...]
    user: tuple[tuple[str, str], ...]
    submitted_tasks: int = 0
    calls: int = 0


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    root = tmp_path_factory.mktemp("fuzz")
    # No rate limits: the fuzzer is one user (and one host) sending thousands of requests, most of them
    # forged, on purpose.
    with running_controller(root, extra="request_rate_per_s = 0\nauth_failure_rate_per_s = 0\n") as controller:
        admin = (("x-garrison-credential", controller.credential()),)
        with controller.client_channel() as channel:
            issued = spb_grpc.SecurityStub(channel).IssueToken(
                spb.IssueTokenRequest(user="nobody", lifetime_s=3600), metadata=admin
            )
            fuzz = Fuzzed(controller, channel, admin, (("x-garrison-token", issued.token),))
            yield fuzz
            # After every test of this module that used this controller (on this worker, under xdist):
            check_aftermath(fuzz)


def identities(fuzz: Fuzzed) -> st.SearchStrategy[tuple[str, tuple[tuple[str, str], ...]]]:
    garbage = strings.filter(lambda s: s.isascii() and s.isprintable())
    return st.one_of(
        st.just(("admin", fuzz.admin)),
        st.just(("user", fuzz.user)),
        st.just(("anonymous", ())),
        garbage.map(lambda s: ("anonymous", (("x-garrison-credential", s),))),
        garbage.map(lambda s: ("anonymous", (("x-garrison-token", s),))),
    )


def check_answer(method: Method, who: str, code: grpc.StatusCode, details: str, size: int,
                 metadata_size: int = 0) -> None:
    where = f"{method.path} as {who} ({size} bytes)"
    if code == grpc.StatusCode.OK:
        assert who != "anonymous" or method.name == "Hello", f"{where}: served without identity"
        return
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and (size > TRANSPORT_LIMIT or metadata_size > METADATA_LIMIT):
        return  # refused by gRPC itself: "Received message larger than max", "metadata size exceeds"
    assert code in CLEAR_REFUSALS, f"{where}: {code.name}: {details}"
    assert details and "\n" not in details and len(details) <= MAX_DETAILS_CHARS, f"{where}: unclear: {details!r}"
    if who == "anonymous":
        assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT), f"{where}: {code.name}"


def call_raw(fuzz: Fuzzed, method: Method, data: bytes, metadata: tuple[tuple[str, str], ...]) -> tuple[grpc.StatusCode, str, bytes]:
    rpc = fuzz.channel.unary_unary(method.path)  # bytes in, bytes out: malformed input reaches the server
    try:
        response = rpc(data, metadata=metadata, timeout=FUZZ_DEADLINE_S)
        return grpc.StatusCode.OK, "", response
    except grpc.RpcError as error:
        return error.code(), error.details() or "", b""


@settings(max_examples=2500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_unary_rpc_answers_hostile_input_clearly(fuzzed: Fuzzed, data: st.DataObject) -> None:
    method = data.draw(st.sampled_from(UNARY), label="method")
    who, metadata = data.draw(identities(fuzzed), label="identity")
    payload, kind = data.draw(payloads(method), label="payload")
    code, details, response = call_raw(fuzzed, method, payload, metadata)
    fuzzed.calls += 1
    metadata_size = sum(len(k) + len(v) for k, v in metadata)
    check_answer(method, who, code, details, len(payload), metadata_size)
    if kind in ("bytes", "truncated") and code != grpc.StatusCode.OK and metadata_size <= METADATA_LIMIT:
        # Bytes that do not decode are INVALID_ARGUMENT, before anything else is looked at.
        try:
            method.request.FromString(payload)
        except Exception:
            assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{method.path}: undecodable -> {code.name}"
            assert details.startswith("malformed request")
    if code == grpc.StatusCode.OK and method.path == "/garrison.v1.Controller/SubmitJob":
        fuzzed.submitted_tasks += pb.SubmitJobResponse.FromString(response).task_count
    if code == grpc.StatusCode.OK and method.path == "/garrison.v1.Security/IssueToken":
        assert who == "admin", "a non-admin got a token issued"


@pytest.mark.parametrize("method", UNARY, ids=lambda m: m.path)
def test_oversized_requests_are_refused_by_size(fuzzed: Fuzzed, method: Method) -> None:
    """Over the transport limit, gRPC refuses before any handler runs; just under it, validation does."""
    huge = b"\x0a" + _varint(TRANSPORT_LIMIT + 10) + b"x" * (TRANSPORT_LIMIT + 10)  # field 1, length-delimited
    code, details, _ = call_raw(fuzzed, method, huge, fuzzed.admin)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert "larger than max" in details


def test_large_but_admissible_fields_are_refused_with_one_line(fuzzed: Fuzzed) -> None:
    big = "x" * (3 << 20)
    stub = pb_grpc.ControllerStub(fuzzed.channel)
    cases: list[tuple[str, Message]] = [
        ("SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(name="j", script=big, workdir="/tmp"))),
        ("SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(name="j", command=[""] * 200_000, workdir="/tmp"))),
        ("SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(name="j", command=["true"], workdir="/tmp", gpu_type=big))),
        ("SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(name="j", command=["true"], workdir="/tmp", qos=big))),
        ("SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(name="j", command=["true"], workdir="/" + big))),
        ("SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(name="j", command=["true"], workdir="/tmp",
                                                          env={f"V{i}": "x" for i in range(20_000)}))),
        ("SubmitJob", pb.SubmitJobRequest(spec=pb.JobSpec(name="j", command=["true"], workdir="/tmp"),
                                          array_indices=list(range(500_000)))),
        ("CancelJobs", pb.CancelJobsRequest(job_ids=["1"] * 500_000)),
        ("ListJobs", pb.ListJobsRequest(users=["u"] * 500_000)),
        ("GetJob", pb.GetJobRequest(job_id=big)),
    ]
    for method, request in cases:
        with pytest.raises(grpc.RpcError) as refused:
            getattr(stub, method)(request, metadata=fuzzed.admin, timeout=FUZZ_DEADLINE_S)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, refused.value.details()[:200])
        assert len(refused.value.details()) < 300, refused.value.details()[:300]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


# ------------------------------------------------------------------------------------- agent stream


def _stream(fuzz: Fuzzed, raw_messages: list[bytes]) -> tuple[grpc.StatusCode, str, list[bytes]]:
    """Send raw messages on the agent stream (as root, an agent uid), then close; collect the answers."""
    rpc = fuzz.channel.stream_stream("/garrison.v1.AgentLink/Connect")
    call = rpc(iter(raw_messages), metadata=fuzz.admin, timeout=FUZZ_DEADLINE_S)
    answers: list[bytes] = []
    try:
        for answer in call:
            answers.append(answer)
        return grpc.StatusCode.OK, "", answers
    except grpc.RpcError as error:
        return error.code(), error.details() or "", answers


def _valid_register(node: str) -> bytes:
    return pb.AgentMessage(
        register=pb.Register(
            node_name=node,
            inventory=pb.NodeInventory(
                hostname="h", gpus=[pb.GpuInfo(index=0, uuid="GPU-0", name="NVIDIA A100")],
                nvlink=[pb.IntRow(values=[0])], topo=[pb.LabelRow(values=["X"])], cpus=4, memory_mb=1024,
            ),
        )
    ).SerializeToString()


agent_messages = messages(pb.AgentMessage.DESCRIPTOR).map(lambda m: m.SerializeToString())


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(first=st.one_of(agent_messages, st.binary(min_size=1, max_size=100)),
       rest=st.lists(st.one_of(agent_messages, st.binary(min_size=1, max_size=50)), max_size=5),
       start_valid=st.booleans())
def test_agent_stream_answers_hostile_input_clearly(fuzzed: Fuzzed, first: bytes, rest: list[bytes],
                                                    start_valid: bool) -> None:
    sequence = ([_valid_register("fuzznode")] if start_valid else [first]) + rest
    code, details, _ = _stream(fuzzed, sequence)
    if code != grpc.StatusCode.OK:
        assert code in CLEAR_REFUSALS, f"agent stream: {code.name}: {details}"
        assert details and "\n" not in details and len(details) <= MAX_DETAILS_CHARS


# ------------------------------------------------------------------------------------- afterwards


def check_aftermath(fuzzed: Fuzzed) -> None:
    """The controller survived everything sent to it, and stored nothing invalid. Run by the fixture's
    teardown, so it follows the fuzz tests on whichever worker ran them (a failure is a teardown error)."""
    controller = fuzzed.controller
    assert controller.process.poll() is None, "the controller died"
    hello = pb_grpc.ControllerStub(fuzzed.channel).Hello(pb.HelloRequest(), timeout=5)
    assert hello.version
    log = controller.log_text()
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]
    if fuzzed.calls:  # the hypothesis test ran against this controller: all of its examples did
        assert fuzzed.calls >= 2500, fuzzed.calls

    assert controller.stop() == 0
    config = load_config(controller.config).controller
    store = open_store(controller.database)
    try:
        loaded = store.load()
    finally:
        store.close()
    # Every stored job was accepted by validation, belongs to a real caller, and was answered OK.
    assert len(loaded.jobs) == fuzzed.submitted_tasks
    for job in loaded.jobs:
        assert (job.user, job.uid) in {("root", 0), ("nobody", 65534)}, job
        principal = Principal(job.user, job.uid, job.gid, (job.gid,))
        validate_submission(job.spec, principal, config, {}, [])
    for node in loaded.nodes:
        assert NODE_NAME.match(node.name), node.name
    # And the store loads into a new controller process, which serves.
    with running_controller(Path(controller.root) / "again", reuse=controller) as again:
        assert again.process.poll() is None
