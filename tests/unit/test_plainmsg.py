"""The plain (JSON) form of messages that gsub and gqueue use on the local socket (garrison/plainmsg.py):
every message survives to_plain -> JSON -> from_plain unchanged, a request that is not a valid message is
refused with one line, and PlainMessage reads like the message it stands for."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_rpc_fuzz import messages

from garrison.cli.render import job_json, job_row
from garrison.model.jobspec import JobSpec, LaunchMode
from garrison.plainmsg import PlainError, PlainMessage, dump_plain, from_plain, parse_plain, to_plain
from garrison.protos.v1 import garrison_pb2 as pb
from garrison.wire.convert_spec import spec_to_pb, spec_to_plain

TYPES = [pb.SubmitJobRequest, pb.SubmitJobResponse, pb.ListJobsRequest, pb.ListJobsResponse, pb.JobInfo]


def canonical(message: object) -> str:
    return json.dumps(to_plain(message), sort_keys=True)  # map entries have no order


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_message_survives_the_round_trip(data: st.DataObject) -> None:
    message_type = data.draw(st.sampled_from(TYPES), label="type")
    message = data.draw(messages(message_type.DESCRIPTOR), label="message")
    again = parse_plain(dump_plain(message), message_type)
    # Compared as JSON text, which is what the CLI reads (and NaN never equals itself).
    assert canonical(again) == canonical(message)


def test_plain_form_keeps_integers_and_leaves_out_unset_optionals() -> None:
    job = pb.JobInfo(job_id=2**63 + 5, display_id="7_1", state="RUNNING", node_list=["n1", "n2"], array_task_id=1)
    job.spec.env["HOME"] = "/root"
    plain = to_plain(job)
    assert plain["job_id"] == 2**63 + 5 and plain["array_task_id"] == 1
    assert "exit_code" not in plain and "array_job_id" not in plain
    assert plain["spec"]["env"] == {"HOME": "/root"}
    assert plain["gpus"] == 0 and plain["attempts"] == []


def test_plain_message_reads_like_the_message() -> None:
    job = pb.JobInfo(job_id=3, display_id="3", name="train", user="ana", account="ml", state="PENDING", reason="Priority",
                     gpus=8, submit_time=100.0, now=160.0, exit_code=0)
    job.spec.env["A"] = "1"
    job.attempts.add(attempt=1, state="FAILED")
    view = PlainMessage(json.loads(dump_plain(job)))
    assert view.HasField("exit_code") and not view.HasField("array_job_id")
    assert view.attempts[0].state == "FAILED" and dict(view.spec.env) == {"A": "1"} and view.spec.env["A"] == "1"
    with pytest.raises(AttributeError):
        view.array_job_id  # noqa: B018 - an unset optional must be asked for with HasField
    assert job_row(view) == job_row(job)
    assert job_json(view) == job_json(job)


def test_a_map_field_reads_as_a_read_only_mapping() -> None:
    """PlainMessage is no collections.abc.Mapping at run time (gjob's launcher does not load it): what the
    Mapping mixins gave is written out, and answers as a dict of the same plain form would."""
    plain = {"env": {"A": "1", "B": "2"}, "attempts": [{"state": "FAILED"}], "limits": {"gpus": 2}}
    view = PlainMessage(plain)
    env = view["env"]  # a map field, as render reads it
    assert "A" in env and "C" not in env and len(env) == 2 and list(env) == ["A", "B"]
    assert env.get("A") == "1" and env.get("C") is None and env.get("C", "x") == "x"
    assert list(env.keys()) == ["A", "B"] and dict(env.items()) == {"A": "1", "B": "2"} and list(env.values()) == ["1", "2"]
    assert env == {"A": "1", "B": "2"} and env != {"A": "1"} and env == PlainMessage({"A": "1", "B": "2"})
    assert view.get("limits") == {"gpus": 2} and isinstance(view.get("limits"), PlainMessage)
    assert {**env} == {"A": "1", "B": "2"}
    with pytest.raises(TypeError):
        hash(env)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"spec": {"gpus": "many"}}', "gpus"),
        (b'{"spec": {"frobnicate": 1}}', "frobnicate"),
        (b'{"array_indices": [-1]}', "array_indices"),
        (b"[1, 2]", "expected a JSON object"),
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_a_bad_request_is_refused_in_one_line(body: bytes, problem: str) -> None:
    with pytest.raises(PlainError, match=problem) as refused:
        parse_plain(body, pb.SubmitJobRequest)
    assert "\n" not in str(refused.value)


@given(
    gpus=st.none() | st.integers(1, 64),
    nodes=st.none() | st.integers(1, 8),
    limit=st.none() | st.integers(1, 10**7),
    script=st.none() | st.text(max_size=20),
    launch=st.sampled_from(list(LaunchMode)),
    requeue=st.booleans(),
    env=st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=3),
)
def test_gsub_sends_what_the_protobuf_conversion_makes(gpus, nodes, limit, script, launch, requeue, env) -> None:  # type: ignore[no-untyped-def]
    spec = JobSpec(name="j", command=("true",), gpus=gpus, nodes=nodes, time_limit_s=limit, script=script,
                   launch=launch, requeue=requeue, env=env, workdir="/tmp")
    assert from_plain(json.loads(json.dumps(spec_to_plain(spec))), pb.JobSpec) == spec_to_pb(spec)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _mutate(value: object, data: st.DataObject, depth: int = 0) -> object:
    """``value`` (a plain form) with one place changed to an arbitrary JSON value: a field's value, a list's
    item, a map's entry, or a key added."""
    if isinstance(value, dict) and value and depth < 4 and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: _mutate(value[key], data, depth + 1)}
    if isinstance(value, list) and value and depth < 4 and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(value) - 1))
        return [*value[:index], _mutate(value[index], data, depth + 1), *value[index + 1:]]
    if isinstance(value, dict) and data.draw(st.booleans()):
        return {**value, data.draw(st.text(max_size=12)): data.draw(json_values)}
    return data.draw(json_values)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_from_plain_agrees_with_protobufs_json_parser(data: st.DataObject) -> None:
    """from_plain takes the common forms itself (ParseDict takes ~0.2 ms for a gsub's request) and leaves the
    rest to json_format.ParseDict: whatever the value, both give the same message or both refuse it."""
    from google.protobuf import json_format

    message_type = data.draw(st.sampled_from([*TYPES, pb.SubmitCommandLineRequest, pb.CancelJobsRequest]))
    plain = json.loads(dump_plain(data.draw(messages(message_type.DESCRIPTOR))))
    value = _mutate(plain, data) if data.draw(st.booleans()) else plain
    if not isinstance(value, dict):
        value = plain  # from_plain refuses a request that is not an object before either parser sees it
    try:
        expected = json_format.ParseDict(value, message_type())
    except (json_format.ParseError, TypeError, ValueError, AttributeError):
        expected = None
    if expected is None:
        with pytest.raises(PlainError):
            from_plain(value, message_type)
    else:
        assert from_plain(value, message_type) == expected
