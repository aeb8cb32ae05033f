"""Hypothesis over the wire: every message kind, well formed and hostile, to a node and to the eavesdropper.

Messages of every kind (config, x, z^(0) plain and sealed, key, status, adv) are drawn from the
wire models with each field either of its kind or hostile (wrong type, huge or negative integer,
NaN, deep nesting, odd dictionary keys), dropped, or joined by an unknown one; beside them raw
payloads (non-UTF-8, truncated JSON, 5000-digit integers, nesting thousands deep) and topics of
other runs, of no node, with leading zeros. Each is published retained or not, before the nodes
start or during their run, against three runs: max on a fixed schedule, median with early
stopping and departures, and average (every z^(0) sealed).

- A node refuses what does not decode, naming why, and finishes bit for bit the simulator's run;
  whatever decodes (a forgery: any password holder can publish it) ends its run either with a
  result or with an :class:`~nlagg_node.errors.NlaggError` saying why, never with another exception.
- The eavesdropper stores every message (valid, or invalid with the reason), never raises, never
  logs a traceback, and a restart over the same transcript (retained statuses included) too.

The default suite runs a few dozen pinned examples (``derandomize``); ``-m slow`` runs many more.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from adversary.capture.eavesdropper import Eavesdropper
from adversary.transcript import Transcript
from adversary.transcript.quota import compact
from nlagg_node.config import RunConfig
from nlagg_node.errors import NlaggError
from nlagg_node.runtime.memory import MemoryBroker, MemoryTransport
from nlagg_node.runtime.node import Node, NodeResult, run_edges
from nlagg_node.runtime.public import build_config_msg
from nlagg_node.runtime.wire import WireError, decode, encode, topics
from nlagg_node.sim import draw_values, simulate

RUN = "fuzz"
T = topics("nlagg", RUN)
N = 4
CFG = RunConfig(op="max", n=N, graph="ring", trials=1, record="all", t_max=40, seed=5, early_stop=False)
DEPARTING = RunConfig(
    op="median", n=N, graph="ring", trials=1, record="all", t_max=40, seed=5, may_depart=True
)
# average seals every z^(0) (X25519 keys, ChaCha20-Poly1305): the sealed exchange under fire
SEALED = RunConfig(
    op="average", n=N, graph="ring", trials=1, record="all", t_max=40, seed=5, early_stop=False
)
# max stopping on the certificate: its x's may carry a candidate (none within these 40 iterations)
CERTIFIED = RunConfig(op="max", n=N, graph="ring", trials=1, record="all", t_max=40, seed=5)
RUNS = {"max": CFG, "median-departing": DEPARTING, "average-sealed": SEALED, "max-certified": CERTIFIED}
STATES = ["online", "running", "done", "leaving", "offline"]
PHASES = ["max", "median", "average", "nope", ""]

FAST = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
MANY = settings(FAST, max_examples=200, derandomize=False)


@dataclass(frozen=True)
class Sent:
    """One message an outsider or a password holder publishes."""

    topic: str
    payload: bytes
    retain: bool
    early: bool  # before the nodes start (and, retained, delivered when they subscribe)


# Values ------------------------------------------------------------------------------------------
HUGE = [2**63, -(2**63) - 1, 2**64 + 7, 10**30, -1]
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 50),
    st.sampled_from(HUGE),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
hostile = st.recursive(
    scalar,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=8,
)
node_id = st.one_of(st.integers(0, N + 1), st.sampled_from(HUGE))
iteration = st.one_of(st.integers(0, 45), st.sampled_from(HUGE))
number = st.one_of(st.floats(-3, 3), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3))
dict_key = st.sampled_from(
    [*(str(i) for i in range(N + 2)), "abc", "01", "-1", "", " 1", "٣", "9" * 5000, "1" * 40]
)


@st.composite
def altered(draw: st.DrawFn, real: Any) -> Any:
    """``real`` (the run's own config section), one of its entries replaced by a hostile value."""
    if isinstance(real, dict) and real and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(real)))
        return {**real, key: draw(hostile | st.sampled_from([0, -1, 10**30, "9" * 5000]))}
    if isinstance(real, list) and real and draw(st.booleans()):
        k = draw(st.integers(0, len(real) - 1))
        return [*real[:k], draw(altered(real[k])), *real[k + 1 :]]
    return real


def b64(size: int) -> st.SearchStrategy[str]:
    return st.binary(min_size=size, max_size=size).map(lambda b: base64.b64encode(b).decode())


def _fields(kind: str, a: int, b: int) -> dict[str, st.SearchStrategy[Any]]:
    """Each field of ``kind``'s model, sent by node ``a`` (to ``b``), and values of its type."""
    if kind == "x":
        return {
            "v": st.just(1),
            "node": st.just(a),
            "t": iteration,
            "phase": st.sampled_from(PHASES),
            "x": number,
            "quiet": iteration,
            "stop": iteration,
            "departures": st.lists(iteration, max_size=3),
            "cand": number,
        }
    if kind == "status":
        return {
            "v": st.just(1),
            "node": st.just(a),
            "state": st.sampled_from(STATES),
            "final": st.lists(number, max_size=3),
            "output": st.lists(number, max_size=3),
            "iterations": iteration,
            "departed": st.dictionaries(dict_key, iteration, max_size=3),
        }
    if kind in ("z0", "sealed"):
        ends = {"v": st.just(1 if kind == "z0" else 2), "from": st.just(a), "to": st.just(b)}
        group = {"group": st.sampled_from(PHASES)}
        if kind == "z0":
            return {**ends, **group, "z": number}
        return {**ends, **group, "nonce": b64(12), "ct": b64(24)}
    if kind == "key":
        return {"v": st.just(2), "node": st.just(a), "key": b64(32)}
    if kind == "adv":
        floats = st.dictionaries(dict_key, number, max_size=3)
        return {"v": st.just(1), "node": st.just(a), "t": iteration, "s": number, "z": floats, "z_in": floats}
    config = build_config_msg(DEPARTING, RUN, run_edges(DEPARTING)).model_dump(by_alias=True)
    return {
        "v": st.just(1),
        "run_id": st.sampled_from([RUN, RUN, "other"]),
        "n": st.one_of(st.just(N), node_id),
        "edges": st.one_of(altered(config["edges"]), st.lists(st.lists(node_id, max_size=3), max_size=5)),
        "run": altered(config["run"]),
        "phases": altered(config["phases"]),
    }


KINDS = ["x", "status", "z0", "sealed", "key", "adv", "config"]
OPTIONAL = {"quiet", "stop", "departures", "cand", "final", "output", "iterations", "departed"}


@st.composite
def model_payload(draw: st.DrawFn, kind: str, a: int, b: int) -> bytes:
    """A JSON object of ``kind``'s fields, a few of them (often none) damaged: hostile, left out, or
    joined by an unknown field; optional ones left out at will."""
    fields = _fields(kind, a, b)
    hurt = draw(st.permutations(list(fields)))[: draw(st.sampled_from([0, 0, 0, 1, 1, 2, 9]))]
    doc: dict[str, Any] = {}
    for name, good in fields.items():
        if name not in hurt:
            if name not in OPTIONAL or draw(st.booleans()):
                doc[name] = draw(good)
            continue
        how = draw(st.sampled_from(["hostile", "missing", "extra"]))
        if how == "hostile":
            doc[name] = draw(hostile)
        elif how == "extra":
            doc[name] = draw(good)
            doc[draw(st.text(max_size=6))] = draw(hostile)
    return json.dumps(doc, allow_nan=True).encode()


NESTING = 5000
KIB = 1024  # a rejected payload is stored capped, at least its first KiB
DIGITS = b"9" * 5000


def raw_payloads(kind: str, a: int, b: int) -> st.SearchStrategy[bytes]:
    """Payloads no JSON model makes: bytes, broken UTF-8 and JSON, huge literals, deep nesting."""
    head = {
        "x": b'{"v":1,"node":%d,"t":0,"phase":"max",' % a,
        "status": b'{"v":1,"node":%d,"state":"running",' % a,
        "z0": b'{"v":1,"from":%d,"to":%d,"group":"max",' % (a, b),
        "sealed": b'{"v":2,"from":%d,"to":%d,"group":"median",' % (a, b),
        "key": b'{"v":2,"node":%d,' % a,
        "adv": b'{"v":1,"node":%d,"t":0,"s":1.0,' % a,
        "config": b'{"v":1,"run_id":"%s",' % RUN.encode(),
    }[kind]
    tails = [
        b'"x":NaN}',
        b'"x":1e999}',
        b'"x":1.0',
        b'"z":-Infinity}',
        b'"iterations":' + DIGITS + b"}",
        b'"departed":{"' + DIGITS + b'":1}}',
        b'"departed":{"1":' + DIGITS + b"}}",
        b'"state":"\xff"}',
        b'"key":"' + b"A" * 43 + b'="}',
        b'"nonce":"AAAAAAAAAAAAAAAA","ct":"' + b"A" * 32 + b'","v":2}',
        b'"z":{"' + DIGITS + b'":1.0},"z_in":{}}',
        b'"n":' + DIGITS + b',"edges":[],"run":{},"phases":[]}',
        b'"x":' + b"[" * NESTING + b"]" * NESTING + b"}",
        b'"x":' + b'{"a":' * NESTING + b"1" + b"}" * (NESTING + 1),
        b'"x":1.0,"x":2.0}',
        b"\xff\xfe}",
    ]
    return st.one_of(
        st.binary(max_size=40),
        st.sampled_from([b"", b"\xff\xfe{", b"null", b"[]", b"[" * NESTING + b"]" * NESTING]),
        st.sampled_from(tails).map(lambda tail: head + tail),
    )


def topic_of(kind: str, a: str, b: str) -> str:
    if kind == "config":
        return T.config
    if kind in ("z0", "sealed"):
        return T.z0(a, b)
    return {"x": T.x, "status": T.status, "key": T.key, "adv": T.adv}[kind](a)


part = st.one_of(
    st.integers(0, N + 1).map(str), st.sampled_from(["01", "-1", "", "abc", "1" * 12, "٣", "+", "#"])
)
foreign = st.sampled_from(
    [f"other/{RUN}/node/1/x", f"nlagg/{RUN}/node/1/x/more", f"nlagg/{RUN}/node/1", f"nlagg/{RUN}", "$SYS/x"]
)


@st.composite
def sent(draw: st.DrawFn) -> Sent:
    kind = draw(st.sampled_from(KINDS))
    a, b = draw(st.integers(0, N - 1)), draw(st.integers(0, N - 1))
    topic = topic_of(kind, str(a), str(b))
    how = draw(st.sampled_from(["same"] * 6 + ["part", "foreign"]))
    if how == "part":
        topic = topic_of(kind, draw(part), draw(part))
    elif how == "foreign":
        topic = draw(foreign)
    payload = draw(st.one_of(model_payload(kind, a, b), model_payload(kind, a, b), raw_payloads(kind, a, b)))
    return Sent(topic, payload, draw(st.booleans()), draw(st.booleans()))


def _wildcard(topic: str) -> bool:
    return "+" in topic or "#" in topic


def _refused(msg: Sent) -> bool:
    """Whether the wire refuses ``msg`` (what a node must drop, whatever its run)."""
    try:
        decode(msg.topic, msg.payload, "nlagg", RUN)
    except WireError:
        return True
    return False


# What the review found (issue 31): a departure claim naming node "abc" crashed the eavesdropper on
# every restart while it stayed retained; so do 5000-digit node ids as keys (int() refuses them).
REVIEWED = [
    Sent(T.status(1), b'{"v":1,"node":1,"state":"running","departed":{"abc":3}}', True, True),
    Sent(T.status(1), b'{"v":1,"node":1,"state":"running","departed":{"' + DIGITS + b'":3}}', True, True),
    Sent(T.adv(1), b'{"v":1,"node":1,"t":0,"s":1.0,"z":{"' + DIGITS + b'":1.0},"z_in":{}}', False, True),
    Sent(T.status(1), b'{"v":1,"node":1,"state":"running","departed":{"0":3}}', True, True),
]


# The node --------------------------------------------------------------------------------------------
async def _run(cfg: RunConfig, messages: list[Sent], patience: float) -> list[NodeResult | NlaggError]:
    """Every node of ``cfg`` over memory, the messages published beside them (early, then during);
    ``patience``: the seconds a node waits for its neighbours (at the start and at each barrier)."""
    broker = MemoryBroker()
    values = draw_values(cfg.values, cfg.seed, 1, cfg.n)[0]
    edges = run_edges(cfg)
    publishable = [m for m in messages if not _wildcard(m.topic) and m.topic]
    async with MemoryTransport(broker, "outsider") as outsider:
        for m in publishable:
            if m.early:
                await outsider.publish(m.topic, m.payload, retain=m.retain)

        async def one(i: int) -> NodeResult | NlaggError:
            transport = MemoryTransport(broker, f"node-{i}")
            try:
                async with Node(
                    cfg,
                    i,
                    values[i],
                    transport,
                    run_id=RUN,
                    edges=edges,
                    neighbour_timeout=patience,
                    startup_timeout=patience,
                ) as node:
                    return await node.run()
            except NlaggError as exc:
                return exc

        async def during() -> None:
            for m in publishable:
                if not m.early:
                    await asyncio.sleep(0.001)
                    await outsider.publish(m.topic, m.payload, retain=m.retain)

        async with asyncio.timeout(12 * patience), asyncio.TaskGroup() as tg:
            tg.create_task(during())
            runs = [tg.create_task(one(i)) for i in range(cfg.n)]
    return [run.result() for run in runs]


@functools.cache
def _simulated_x(run: str) -> np.ndarray[Any, np.dtype[np.float64]]:
    return simulate(RUNS[run]).recorded_x[:, 0, :]


def _check_refused_leave_the_run_exact(run: str, messages: list[Sent]) -> None:
    refused = [m for m in messages if _refused(m)]
    results = asyncio.run(_run(RUNS[run], refused, patience=30.0))  # it must never run out
    errors = [r for r in results if isinstance(r, NlaggError)]
    assert not errors, errors
    x = np.array([r.x for r in results if isinstance(r, NodeResult)]).T
    assert np.array_equal(x, _simulated_x(run))


def _check_any_message_ends_with_a_result_or_a_named_error(cfg: RunConfig, messages: list[Sent]) -> None:
    for result in asyncio.run(_run(cfg, messages, patience=5.0)):  # a forgery may stall the run
        assert isinstance(result, NodeResult) or str(result), result


@FAST
@given(st.sampled_from(sorted(RUNS)), st.lists(sent(), min_size=1, max_size=12))
@example("median-departing", REVIEWED[:3])
def test_a_node_refuses_what_does_not_decode_and_stays_exact(run: str, messages: list[Sent]) -> None:
    _check_refused_leave_the_run_exact(run, messages)


@FAST
@given(st.sampled_from(sorted(RUNS)), st.lists(sent(), min_size=1, max_size=12))
@example("median-departing", REVIEWED[:3])
def test_a_node_ends_with_a_result_or_a_named_error_whatever_it_is_sent(
    run: str, messages: list[Sent]
) -> None:
    _check_any_message_ends_with_a_result_or_a_named_error(RUNS[run], messages)


# The eavesdropper --------------------------------------------------------------------------------------
class _Tracebacks(logging.Handler):
    """Records logged with an exception (the eavesdropper's last resort: a crash it survived)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is not None:
            self.seen.append(record.getMessage())


def _capture(folder: Path, cfg: RunConfig | None, messages: list[Sent]) -> set[tuple[str, bytes]]:
    """The messages handed to an eavesdropper (config in advance, or none), then a restart over the
    same transcript; returns what the transcript holds (topic, payload's first KiB)."""
    config = None if cfg is None else build_config_msg(cfg, RUN, run_edges(cfg))
    db = folder / "t.sqlite"
    with Transcript(db, run_id=RUN) as transcript:
        eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "eve"), transcript, config=config)
        for m in messages:
            eaves.handle(m.topic, m.payload, m.retain)
        transcript.commit()
        assert eaves.captured == len(messages)
    with Transcript(db, run_id=RUN) as transcript:  # a restart: what is retained comes again
        eaves = Eavesdropper(MemoryTransport(MemoryBroker(), "eve"), transcript, config=config)
        for m in messages:
            if m.retain:
                eaves.handle(m.topic, m.payload, True)
        transcript.commit()
    with contextlib.closing(sqlite3.connect(db)) as con:
        return {(str(t), bytes(p)[:KIB]) for t, p in con.execute("SELECT topic, payload FROM messages")}


def _stored_forms(m: Sent) -> set[bytes]:
    """What a transcript may hold of ``m`` (first KiB): the payload as sent, or, for a padded message
    the nodes would use, its canonical encoding (:func:`adversary.transcript.quota.compact`)."""
    forms = {m.payload[:KIB]}
    try:
        _, msg = decode(m.topic, m.payload, "nlagg", RUN)
    except WireError:
        return forms
    return forms | {compact(m.payload, msg)[:KIB]}


def _check_the_eavesdropper_stores_everything(cfg: RunConfig | None, messages: list[Sent]) -> None:
    tracebacks = _Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    try:
        with tempfile.TemporaryDirectory() as folder:
            stored = _capture(Path(folder), cfg, messages)
    finally:
        logging.getLogger().removeHandler(tracebacks)
    missing = [m for m in messages if not {(m.topic, form) for form in _stored_forms(m)} & stored]
    assert missing == []  # valid, or invalid with the reason
    assert tracebacks.seen == []


def _with_config(messages: list[Sent]) -> list[Sent]:
    """The run's own config, retained, among ``messages`` (where a capture meets it first)."""
    own = Sent(T.config, encode(build_config_msg(DEPARTING, RUN, run_edges(DEPARTING))), True, True)
    return [*messages[: len(messages) // 2], own, *messages[len(messages) // 2 :]]


def _check_a_capture(how: str, messages: list[Sent]) -> None:
    """``how`` the eavesdropper knows the config: in advance, captured among the messages, not at all."""
    if how == "captured":
        messages = _with_config(messages)
    _check_the_eavesdropper_stores_everything(DEPARTING if how == "in-advance" else None, messages)


CAPTURES = ["in-advance", "captured", "none"]
# A config the nodes would use, padded past the transcript's cap: stored in its canonical form.
PADDED_CONFIG = Sent(
    T.config,
    encode(build_config_msg(DEPARTING, RUN, run_edges(DEPARTING))).replace(b",", b"," + b" " * 200),
    False,
    False,
)


@FAST
@given(st.sampled_from(CAPTURES), st.lists(sent(), min_size=1, max_size=20))
@example("in-advance", REVIEWED)
@example("captured", REVIEWED)
@example("none", [Sent(T.x(0), b"", False, False), PADDED_CONFIG])
def test_the_eavesdropper_stores_every_message_and_never_raises(how: str, messages: list[Sent]) -> None:
    _check_a_capture(how, messages)


CHECKS: dict[str, Callable[[list[Sent]], None]] = {
    **{f"node-refuses-{run}": functools.partial(_check_refused_leave_the_run_exact, run) for run in RUNS},
    **{
        f"node-{run}": functools.partial(_check_any_message_ends_with_a_result_or_a_named_error, cfg)
        for run, cfg in RUNS.items()
    },
    **{f"eavesdropper-{how}": functools.partial(_check_a_capture, how) for how in CAPTURES},
}


@pytest.mark.slow
@pytest.mark.parametrize("check", list(CHECKS), ids=list(CHECKS))
def test_many_more_messages(check: str) -> None:
    @MANY
    @given(st.lists(sent(), min_size=1, max_size=30))
    def many(messages: list[Sent]) -> None:
        CHECKS[check](messages)

    many()
