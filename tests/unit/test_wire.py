"""Wire protocol v1: topics, exact floats, validation errors that name field and value."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nlagg_node.limits import MAX_ITERATIONS, MAX_NODES
from nlagg_node.runtime.transport import topic_matches, valid_filter
from nlagg_node.runtime.wire import (
    MAX_PAYLOAD_BYTES,
    AdvStateMsg,
    HotDecoder,
    KeyMsg,
    StatusMsg,
    TopicInfo,
    WireError,
    XMsg,
    Z0Msg,
    check_run_id,
    decode,
    encode,
    encode_x,
    parse_topic,
    shared_run,
    stale_run,
    topics,
)

T = topics("nlagg", "r1")
HOT = HotDecoder("nlagg", "r1")


def decode_hot(topic: str, payload: bytes, prefix: str, run_id: str) -> tuple[TopicInfo, object]:
    assert (prefix, run_id) == (HOT.prefix, HOT.run_id)
    return HOT.decode(topic, payload)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_x_roundtrip_is_bit_exact(x: float) -> None:
    payload = encode(XMsg(node=3, t=7, phase="max", x=x))
    _, msg = decode(T.x(3), payload, "nlagg", "r1")
    assert isinstance(msg, XMsg)
    assert math.copysign(1.0, msg.x) == math.copysign(1.0, x)
    assert msg.x == x


_FINITE = st.floats(allow_nan=False, allow_infinity=False)


@given(
    _FINITE,
    st.integers(0, 10**6),
    st.none() | st.integers(0, 10**6),
    st.none() | st.lists(st.integers(0, 10**6), min_size=1, max_size=3, unique=True).map(sorted),
    st.none() | _FINITE,
    st.none() | st.just("A" * 22 + "=="),
)
def test_x_encoder_writes_what_json_dumps_writes(
    x: float, t: int, quiet: int | None, departures: list[int] | None, cand: float | None, k: str | None
) -> None:
    """Byte for byte ``json.dumps`` of the fields in order, None left out: what the nodes always sent."""
    deps = None if departures is None else tuple(departures)
    msg = XMsg(node=4, t=t, phase="max-2", x=x, quiet=quiet, departures=deps, cand=cand, k=k)
    body = {"v": 1, "node": 4, "t": t, "phase": "max-2", "x": x, "quiet": quiet}
    body |= {"departures": departures, "cand": cand, "k": k}
    expected = json.dumps({key: v for key, v in body.items() if v is not None}, separators=(",", ":"))
    assert encode_x(4, t, "max-2", x, quiet, None, deps, cand, k) == encode(msg) == expected.encode()


def test_a_numpy_float_is_written_as_the_python_float() -> None:
    """A candidate a node restores from its checkpoint is a numpy float, whose own repr is not JSON."""
    payload = encode_x(0, 0, "max", np.float64(0.5), cand=np.float64(1e16))
    assert payload == b'{"v":1,"node":0,"t":0,"phase":"max","x":0.5,"cand":1e+16}'


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"x": math.nan}, "x"),
        ({"x": 1.0, "cand": -math.inf}, "cand"),
        ({"x": 1.0, "departures": (5, 5)}, "departures"),
        ({"x": 1.0, "departures": ()}, "departures"),
    ],
    ids=["nan", "infinite-cand", "repeated-departure", "empty-departures"],
)
def test_an_x_that_cannot_be_sent_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(WireError) as info:
        encode_x(0, 0, "max", **fields)
    with pytest.raises(WireError) as via_struct:
        encode(XMsg(node=0, t=0, phase="max", **fields))
    assert info.value.field == via_struct.value.field == field


@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(0, MAX_ITERATIONS - 1))
def test_hot_x_decode_is_bit_exact(x: float, t: int) -> None:
    payload = encode_x(node=3, t=t, phase="max", x=x, quiet=7, stop=t + 5)
    decode_hot(T.x(3), payload, "nlagg", "r1")  # a topic's first x goes through the models
    _, msg = decode_hot(T.x(3), payload, "nlagg", "r1")
    assert isinstance(msg, XMsg)
    assert (msg.node, msg.t, msg.phase, msg.quiet, msg.stop) == (3, t, "max", 7, t + 5)
    assert math.copysign(1.0, msg.x) == math.copysign(1.0, x)
    assert msg.x == x


_HOT_VALUES = st.one_of(
    st.integers(-2, 3),
    st.sampled_from(
        [MAX_NODES - 1, MAX_NODES, MAX_ITERATIONS - 1, MAX_ITERATIONS, MAX_ITERATIONS + MAX_NODES, 2**70]
    ),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(0, 2), max_size=2),
)
_HOT_KEYS = ["v", "node", "t", "phase", "x", "quiet", "stop", "departures", "cand"]


def _outcome(topic: str, payload: bytes, fn: object) -> tuple[object, ...]:
    try:
        _, msg = fn(topic, payload, "nlagg", "r1")  # type: ignore[operator]
    except WireError as exc:
        return ("error", str(exc))
    values = (getattr(msg, k) for k in _HOT_KEYS[1:])  # "v": the tag, not a field
    return (
        "ok",
        *(repr(list(v) if isinstance(v, tuple) else v) for v in values),
    )  # departures: list or tuple


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from([*_HOT_KEYS, "s"]), _HOT_VALUES),
    st.fixed_dictionaries(
        {"node": st.just(3), "t": st.integers(0, 9), "phase": st.just("max"), "x": st.floats()}
    ),
    st.booleans(),
)
def test_hot_x_decode_agrees_with_the_models(
    noise: dict[str, object], base: dict[str, object], dup: bool
) -> None:
    """Whatever the payload, the hot path (a topic seen before) accepts what :func:`decode` accepts, or
    names the same error."""
    body = {**base, **noise}
    text = json.dumps(body, separators=(",", ":"))
    if dup:  # a repeated key: the last one wins on both paths
        text = text[:-1] + ',"t":4}'
    payload = text.encode()
    assert _outcome(T.x(3), payload, decode_hot) == _outcome(T.x(3), payload, decode)


@pytest.mark.parametrize(
    "payload",
    [
        b'{"v":1.0,"node":3,"t":0,"phase":"max","x":1.0}',
        b'{"v":1,"node":3,"t":0,"phase":"m\xffax","x":1.0}',
        b'{"v":1,"node":3,"t":0,"phase":"\\ud800","x":1.0}',
        b'{"v":1,"node":3,"t":0,"phase":"max","x":1e999}',
        b'{"v":1,"node":3,"t":0,"phase":"max","x":1} x',
        b'\xef\xbb\xbf{"v":1,"node":3,"t":0,"phase":"max","x":1}',
    ],
    ids=["float-version", "bad-utf8", "lone-surrogate", "overflow", "trailing", "bom"],
)
def test_hot_x_decode_edge_cases_agree(payload: bytes) -> None:
    assert _outcome(T.x(3), payload, decode_hot) == _outcome(T.x(3), payload, decode)


def test_floats_use_shortest_repr() -> None:
    payload = encode(XMsg(node=0, t=0, phase="max", x=0.1 + 0.2))
    assert payload == b'{"v":1,"node":0,"t":0,"phase":"max","x":0.30000000000000004}'


def test_z0_uses_from_key() -> None:
    payload = encode(Z0Msg.model_validate({"from": 2, "to": 5, "group": "max", "z": -1.5}))
    assert json.loads(payload) == {"v": 1, "from": 2, "to": 5, "group": "max", "z": -1.5}
    info, msg = decode(T.z0(2, 5), payload, "nlagg", "r1")
    assert info == TopicInfo("z0", 2, 5)
    assert isinstance(msg, Z0Msg)
    assert (msg.from_, msg.to) == (2, 5)


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("nlagg/r1/config", TopicInfo("config")),
        ("nlagg/r1/edge/0/12/z0", TopicInfo("z0", 0, 12)),
        ("nlagg/r1/node/4/x", TopicInfo("x", 4)),
        ("nlagg/r1/node/4/status", TopicInfo("status", 4)),
        ("nlagg/r1/adv/9/state", TopicInfo("adv", 9)),
    ],
    ids=["config", "z0", "x", "status", "adv"],
)
def test_parse_topic(topic: str, expected: TopicInfo) -> None:
    assert parse_topic(topic, "nlagg", "r1") == expected


@pytest.mark.parametrize(
    "topic",
    [
        "nlagg/r2/node/4/x",
        "nlagg/r1/node/04/x",
        "nlagg/r1/node/-1/x",
        "nlagg/r1/node/4/y",
        "nlagg/r1/edge/1/z0",
    ],
    ids=["other-run", "leading-zero", "negative", "unknown-leaf", "short-edge"],
)
def test_foreign_topics_are_rejected(topic: str) -> None:
    with pytest.raises(WireError, match="topic"):
        parse_topic(topic, "nlagg", "r1")


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b'{"v":1,"node":3,"t":0,"phase":"max","x":NaN}', "x"),
        (b'{"v":1,"node":3,"t":0,"phase":"max","x":1e999}', "x"),
        (b'{"v":1,"node":3,"t":"0","phase":"max","x":1.0}', "t"),
        (b'{"v":1,"node":3,"t":-1,"phase":"max","x":1.0}', "t"),
        (b'{"v":1,"node":4,"t":0,"phase":"max","x":1.0}', "node"),
        (b'{"v":2,"node":3,"t":0,"phase":"max","x":1.0}', "v"),
        (b'{"v":1,"node":3,"t":0,"phase":"max"}', "x"),
        (b'{"v":1,"node":3,"t":0,"phase":"max","x":1.0,"s":0.5}', "s"),
        (b'{"v":1,"node":3,"t":0,"phase":"max","x":1.0,"departures":[4,2]}', "departures"),
        (b'{"v":1,"node":3,"t":0,"phase":"max","x":1.0,"departures":[2,-4]}', "departures.1"),
        (b"[1,2]", "payload"),
        (b"[" * 20000 + b"]" * 20000, "payload"),
        (b"\xff\xfe", "payload"),
    ],
    ids=[
        "nan",
        "inf",
        "string-int",
        "negative-t",
        "node-mismatch",
        "version",
        "missing",
        "extra",
        "unordered-departures",
        "negative-departure",
        "array",
        "nested-deeper-than-json-reads",
        "binary",
    ],
)
def test_malformed_payload_names_field(payload: bytes, field: str) -> None:
    with pytest.raises(WireError) as info:
        decode(T.x(3), payload, "nlagg", "r1")
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}=")


def test_oversized_payload_is_rejected_before_parsing() -> None:
    with pytest.raises(WireError, match="larger than"):
        decode(T.x(3), b" " * (MAX_PAYLOAD_BYTES + 1), "nlagg", "r1")


def test_encode_refuses_nan() -> None:
    msg = AdvStateMsg.model_construct(node=1, t=0, s=float("nan"), z={}, z_in={})
    with pytest.raises(WireError, match="cannot encode"):
        encode(msg)


def test_status_done_carries_final() -> None:
    payload = encode(StatusMsg(node=1, state="done", final=[1.5], output=[1.5], iterations=10))
    _, msg = decode(T.status(1), payload, "nlagg", "r1")
    assert isinstance(msg, StatusMsg)
    assert msg.output == [1.5]


@pytest.mark.parametrize(
    "run_id", ["", "a b", "x" * 65, "a/b", "ü"], ids=["empty", "space", "long", "slash", "utf8"]
)
def test_bad_run_id(run_id: str) -> None:
    with pytest.raises(WireError, match="run_id"):
        check_run_id(run_id)


@pytest.mark.parametrize(
    ("pattern", "topic", "match"),
    [
        ("a/+/c", "a/b/c", True),
        ("a/+/c", "a/b/d", False),
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("+/b", "a/b/c", False),
        ("#", "$SYS/x", False),
        ("a/b", "a/b", True),
    ],
    ids=["plus", "plus-miss", "hash-parent", "hash-deep", "too-short", "sys", "literal"],
)
def test_topic_matches(pattern: str, topic: str, match: bool) -> None:
    assert topic_matches(pattern, topic) is match


@pytest.mark.parametrize(("pattern", "ok"), [("a/#", True), ("a/#/b", False), ("a+/b", False), ("", False)])
def test_valid_filter(pattern: str, ok: bool) -> None:
    assert valid_filter(pattern) is ok


KEY = "A" * 43 + "="
EPOCH = topics("farm/site", "e3", shared=True)  # epoch 3 of deployment site under prefix farm


@pytest.mark.parametrize(
    ("msg", "wire"),
    [
        (
            StatusMsg(node=1, state="online"),
            b'{"v":1,"node":1,"state":"online","final":null,"output":null,"iterations":null}',
        ),
        (
            StatusMsg(node=1, state="done", final=[1.5], output=[1.5], iterations=10, departed={"2": 3}),
            b'{"v":1,"node":1,"state":"done","final":[1.5],"output":[1.5],"iterations":10,"departed":{"2":3}}',
        ),
        (KeyMsg(node=1, key=KEY), b'{"v":2,"node":1,"key":"' + KEY.encode() + b'"}'),
    ],
    ids=["status", "done", "key"],
)
def test_a_single_runs_status_and_key_are_as_before(msg: StatusMsg | KeyMsg, wire: bytes) -> None:
    assert (encode(msg), T.status(1), T.key(1)) == (wire, "nlagg/r1/node/1/status", "nlagg/r1/node/1/key")


def test_an_epochs_status_and_key_are_on_the_shared_topics_naming_the_run() -> None:
    assert (EPOCH.status(2), EPOCH.key(2), EPOCH.x(2)) == (
        "farm/site/node/2/status",
        "farm/site/node/2/key",
        "farm/site/e3/node/2/x",
    )
    assert (EPOCH.named, T.named) == ("e3", None)
    payload = encode(StatusMsg(node=2, state="offline", run="e3"))
    assert (
        payload
        == b'{"v":1,"node":2,"state":"offline","final":null,"output":null,"iterations":null,"run":"e3"}'
    )
    for run_id in ("e3", "e4"):  # the shared topic is every epoch's: the payload says whose it is
        info, msg = decode(EPOCH.status(2), payload, "farm/site", run_id)
        assert (info, stale_run(msg, run_id)) == (
            TopicInfo("status", 2, shared=True),
            None if run_id == "e3" else "e3",
        )
    key = encode(KeyMsg(node=2, key=KEY, run="e3r"))
    assert shared_run(EPOCH.key(2), key, "farm/site") == "e3r"
    assert shared_run(EPOCH.x(2), b"{}", "farm/site") is None


@pytest.mark.parametrize(
    ("topic", "payload", "field"),
    [
        (EPOCH.status(2), b'{"v":1,"node":2,"state":"online"}', "run"),
        (EPOCH.key(2), b'{"v":2,"node":2,"key":"' + KEY.encode() + b'"}', "run"),
        ("farm/site/e3/node/2/status", b'{"v":1,"node":2,"state":"online","run":"e3"}', "run"),
        (EPOCH.status(2), b'{"v":1,"node":2,"state":"online","run":"e 3"}', "run"),
        (EPOCH.status(2), b'{"v":1,"node":3,"state":"online","run":"e3"}', "node"),
    ],
    ids=["shared-status-without-run", "shared-key-without-run", "run-on-a-runs-own-topic", "bad-run", "node"],
)
def test_the_run_field_only_and_always_on_a_shared_topic(topic: str, payload: bytes, field: str) -> None:
    with pytest.raises(WireError) as info:
        decode(topic, payload, "farm/site", "e3")
    assert info.value.field == field
