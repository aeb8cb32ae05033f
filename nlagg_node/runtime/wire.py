"""Wire protocol v1 and v2: topics, message models, exact-float JSON encoding (see ``docs/protocol.md``).

Topics, under prefix ``P`` (default ``nlagg``) and run id ``R``::

    P/R/config                  retained, the public run configuration (launcher only)
    P/R/edge/{i}/{j}/z0         z_{i|j}^(0), once per dual group, node i -> neighbour j
    P/R/node/{i}/x              x_i^(t), every iteration t
    P/R/host/{lo}-{hi}/x        the x's of the nodes lo..hi one process hosts, one message an iteration
    P/R/node/{i}/status         retained; online | running | done | leaving | offline (the last will)
    P/R/node/{i}/key            retained, v2: node i's ephemeral X25519 public key of the run
    P/R/adv/{i}/state           only from a corrupted node: s_i and its duals, every iteration

A continuous deployment (:mod:`nlagg_node.runtime.epochdriver`) runs epoch k as the run ``e{k}`` under
prefix ``P/R``, but its retained status and key are on topics every epoch shares,
``P/R/node/{i}/status`` and ``P/R/node/{i}/key`` (``topics(P/R, e{k}, shared=True)``): their
payload names its run (``"run": "e{k}"``), and a status or key of another run is stale, never
this run's (:func:`stale_run`). The broker then holds a bounded set of retained topics however many
epochs run (Mosquitto never frees a topic level once made). A single run's topics and payloads
carry no ``run``.

Payloads are UTF-8 JSON objects with ``"v": 1``, except the two messages of the sealed
initialization (``"v": 2``, :mod:`nlagg_node.runtime.seal`): the key and the sealed z^(0)
``{"v":2, "from", "to", "group", "nonce", "ct"}``. Floats are written by :func:`json.dumps`,
i.e. with Python's shortest round-trip ``repr``, so a transcript holds the exact doubles;
NaN and infinities are refused on both sides.

The models are the validation boundary: pydantic for every message but the x, the only
per-iteration traffic, whose one schema is the msgspec struct :class:`XMsg`. Its decoder (:func:`decode`
and :class:`HotDecoder` alike) and its encoder (:func:`encode_x`, written from the struct's fields
at import) both come from it (``benchmarks/bench_wire.py`` measures them).

A process that hosts several nodes (``nlagg testbed --in-process``) coalesces their x's of an
iteration into one message on ``P/R/host/{lo}-{hi}/x`` (:class:`XBatchMsg`, :func:`encode_x_batch`):
each item is byte for byte the payload node i would publish on ``P/R/node/{i}/x``, signature
included, and :func:`split_x_batch` gives it back as that (topic, payload), refusing, named, an item
of a node outside lo..hi (the host's node set is the topic's range). A lone node publishes on its own
topic; receivers take an x from either the same way.
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import isfinite as _isfinite
from typing import Annotated, Any, Literal, ParamSpec, cast

import msgspec
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ..errors import WireError
from ..limits import MAX_ITERATIONS, MAX_NODES

__all__ = [
    "MAX_BATCH",
    "MAX_PAYLOAD_BYTES",
    "PROTOCOL_VERSION",
    "AdvStateMsg",
    "ConfigMsg",
    "Decoded",
    "HotDecoder",
    "KeyMsg",
    "SealedZ0Msg",
    "StatusMsg",
    "TopicInfo",
    "WireError",
    "WireMessage",
    "XBatchMsg",
    "XItem",
    "XMsg",
    "Z0Msg",
    "batch_range",
    "check_run_id",
    "decode",
    "encode",
    "encode_x",
    "encode_x_batch",
    "parse_topic",
    "shared_run",
    "split_x_batch",
    "stale_run",
    "topics",
]

PROTOCOL_VERSION = 1
MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB: a config with a few thousand edges fits, garbage does not
MAX_BATCH = 256  # x's in one host message (a signed item is about 250 bytes: about 64 KiB)
RUN_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$")

Kind = Literal["config", "z0", "x", "status", "adv", "key"]
NodeState = Literal["online", "running", "done", "leaving", "offline"]


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _node_key(text: str) -> str:
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or text != str(int(text)):
        raise ValueError("must be a node id, in decimal without leading zeros")
    if int(text) >= MAX_NODES:
        raise ValueError(f"must be a node id below {MAX_NODES}")
    return text


Finite = Annotated[float, AfterValidator(_finite)]
NodeId = Annotated[int, Field(ge=0, lt=MAX_NODES)]
NodeKey = Annotated[str, AfterValidator(_node_key)]  # a node id as a JSON object's key: str(j)
Iteration = Annotated[int, Field(ge=0, lt=MAX_ITERATIONS)]  # SQLite-safe, bounded by every run
P = ParamSpec("P")  # what a struct's constructor takes: its encoder takes the same
_B64_RE = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_SIG_PATTERN = "^[A-Za-z0-9+/]{86}==$"  # base64 of a 64-byte Ed25519 signature
_K_PATTERN = "^[A-Za-z0-9+/]{22}==$"  # base64 of a 16-byte key-chain element


def _run_id(text: str) -> str:
    if not RUN_ID_RE.match(text):
        raise ValueError("must be a run id: 1-64 characters of [A-Za-z0-9_-]")
    return text


RunId = Annotated[str, AfterValidator(_run_id)]


def _b64_of(size: int) -> AfterValidator:
    def check(text: str) -> str:
        if len(text) != 4 * ((size + 2) // 3) or not _B64_RE.match(text):
            raise ValueError(f"must be the standard base64 of {size} bytes")
        return text

    return AfterValidator(check)


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)
    v: Literal[1] = 1


class _Signed(_Msg):
    """A node's message: in a run with identities it ends with its signature (base64 of 64 bytes,
    :mod:`nlagg_node.protocol.identity`); without, it has none."""

    sig: Annotated[str, _b64_of(64)] | None = None


class ConfigMsg(_Msg):
    """``P/R/config``: what every participant may know. Never a private value, never a seed."""

    run_id: str
    n: Annotated[int, Field(ge=2, le=MAX_NODES)]
    edges: list[Annotated[list[NodeId], Field(min_length=2, max_length=2)]]
    run: dict[str, Any]  # RunConfig fields minus seed/trials/record/graph_file, operator defaults resolved
    phases: list[dict[str, Any]]  # name, group, t_len, c, objective: the schedule every node follows
    # The nodes' Ed25519 public keys (base64, index = node id) in a run whose nodes sign their messages.
    identities: list[Annotated[str, _b64_of(32)]] | None = None
    # The run instance (a fresh nonce per start of a plan, :mod:`nlagg_node.protocol.instance`), the
    # launcher's public key that signs it, and that signature.
    instance: Annotated[str, _b64_of(16)] | None = None
    launcher: Annotated[str, _b64_of(32)] | None = None
    sig: Annotated[str, _b64_of(64)] | None = None


class Z0Msg(_Signed):
    """``P/R/edge/{i}/{j}/z0``: ``z_{i|j}^(0)`` of dual group ``group``."""

    from_: NodeId = Field(alias="from")
    to: NodeId
    group: str
    z: Finite


class _Msg2(_Signed):
    v: Literal[2] = 2  # type: ignore[assignment]


class KeyMsg(_Msg2):
    """``P/R/node/{i}/key`` (retained, v2): node i's X25519 public key of this run, base64.

    ``run``: the run it is of, on a deployment's shared key topic (only there)."""

    node: NodeId
    key: Annotated[str, _b64_of(32)]
    run: RunId | None = None


class SealedZ0Msg(_Msg2):
    """``P/R/edge/{i}/{j}/z0`` (v2): ``z_{i|j}^(0)`` of ``group`` sealed with the edge's key.

    ``ct`` is the ChaCha20-Poly1305 ciphertext of the 8 little-endian bytes of the double,
    ``nonce`` its 96-bit nonce, both base64; the topic and the group are the associated data.
    """

    from_: NodeId = Field(alias="from")
    to: NodeId
    group: str
    nonce: Annotated[str, _b64_of(12)]
    ct: Annotated[str, _b64_of(24)]


def _strictly_up(values: Sequence[int]) -> bool:
    return len(values) < 2 or all(a < b for a, b in itertools.pairwise(values))  # mostly one


class XMsg(msgspec.Struct, tag_field="v", tag=1, frozen=True, forbid_unknown_fields=True, gc=False):
    """``P/R/node/{i}/x``: ``x_i^(t)``, t counted across phases; the x message's one schema.

    With early stopping (:mod:`nlagg_node.termination`) it also carries the node's quiet counter
    ``quiet`` and, once one is known, the phase's stop iteration ``stop``; without, neither. In a
    run whose nodes may depart, ``departures`` lists the recent departure iterations of the phase
    the node knows of (ascending; absent when none). In a run that stops on the certificate
    (``RunConfig.certified``), ``cand`` is the node's candidate for the output once it has one
    (:mod:`nlagg_node.termination`, "the certified stop"); absent in every other run. ``k``: the
    sender's key-chain element (a run with identities, :mod:`nlagg_node.protocol.chain`); ``sig``
    its signature where the run signs x's (:mod:`nlagg_node.protocol.identity` appends it last).

    ``"v": 1`` is the struct's tag: written first, optional when read, any other value refused.
    The fields are in wire order: :func:`encode_x`, compiled from them, takes what the constructor
    takes and writes them so, leaving out a None. Decoding checks every bound below; decoding and
    encoding check :func:`_check_x` too (finite numbers, ascending departures); constructing one
    checks nothing (a struct is only built from what a decoder took, or to be encoded).
    Untracked by the garbage collector (``gc=False``): it holds only numbers and strings, so it
    cannot be part of a cycle, and one is allocated per x received.
    """

    node: Annotated[int, msgspec.Meta(ge=0, lt=MAX_NODES)]
    t: Annotated[int, msgspec.Meta(ge=0, lt=MAX_ITERATIONS)]
    phase: str  # a phase name, [a-z0-9-]: written without JSON escaping
    x: float
    quiet: Annotated[int, msgspec.Meta(ge=0, le=MAX_ITERATIONS)] | None = None
    stop: Annotated[int, msgspec.Meta(ge=0, lt=MAX_ITERATIONS + MAX_NODES)] | None = None
    departures: (
        Annotated[
            tuple[Annotated[int, msgspec.Meta(ge=0, lt=MAX_ITERATIONS)], ...],
            msgspec.Meta(min_length=1, max_length=MAX_NODES),
        ]
        | None
    ) = None
    cand: float | None = None  # the certified stop's candidate, protocol scale (a certified run only)
    k: Annotated[str, msgspec.Meta(min_length=24, max_length=24, pattern=_K_PATTERN)] | None = None
    sig: Annotated[str, msgspec.Meta(min_length=88, max_length=88, pattern=_SIG_PATTERN)] | None = None


def _check_x(x: float, cand: float | None, departures: tuple[int, ...] | None) -> None:
    """What :class:`XMsg`'s field types cannot say, checked by every decoder and the encoder:
    raises :class:`WireError` naming the field and the value. (Not ``__post_init__``: a decoded
    struct would pay for the call, and the encoder builds none.)"""
    if not _isfinite(x):
        raise WireError("x", x, "must be a finite number")
    if cand is not None and not _isfinite(cand):
        raise WireError("cand", cand, "must be a finite number")
    if departures is not None and not (departures and _strictly_up(departures)):
        raise WireError("departures", departures, "must be strictly ascending, and absent when empty")


def _x_writer(schema: Callable[P, XMsg]) -> Callable[P, bytes]:
    """The encoder of ``schema`` (:class:`XMsg`), compiled from its fields (as :mod:`dataclasses`
    writes ``__init__``): a function taking what the struct's constructor takes, without building it.

    It runs :func:`_check_x` on its arguments, then writes the tag and one f-string per field in
    the struct's order: an int as ``str``, a float as the ``repr`` of the Python float (what
    :func:`json.dumps` writes: the exact double), a string quoted (the struct's strings need no
    escaping), a tuple of ints as a list; a field that may be None is left out when it is, as
    :func:`encode` leaves out None. msgspec's own encoder spells floats differently (``1e16``
    for ``1e+16``), so it is not used to write.
    """
    info = msgspec.inspect.type_info(schema)
    assert isinstance(info, msgspec.inspect.StructType), info
    assert isinstance(info.tag, int), info  # "v":1
    params, lines, text = [], [], f'"{info.tag_field}":{info.tag}'
    for field in info.fields:
        kind = field.type
        optional = isinstance(kind, msgspec.inspect.UnionType)
        if isinstance(kind, msgspec.inspect.UnionType):
            kind = kind.types[0]
        value = field.name
        if isinstance(kind, msgspec.inspect.FloatType):  # float(): a numpy float's repr is np.float64(...)
            value = f"{{float({value})!r}}"
        elif isinstance(kind, msgspec.inspect.StrType):
            value = f'"{{{value}}}"'
        elif isinstance(kind, msgspec.inspect.VarTupleType):
            value = f'[{{",".join(map(str, {value}))}}]'
        else:
            assert isinstance(kind, msgspec.inspect.IntType), kind
            value = f"{{{value}}}"
        item = f',"{field.name}":{value}'
        if optional:
            assert field.default is None, field  # left out when None: its default
            params.append(f"{field.name}=None")
            lines.append(f"    if {field.name} is not None:\n        text += f'{item}'")
        else:
            assert not lines, f"{field.name}: a required field after an optional one"
            params.append(field.name)
            text += item
    checked = ", ".join(inspect.signature(_check_x).parameters)
    head = [f"def encode_x({', '.join(params)}):", f"    _check_x({checked})", f"    text = f'{{{{{text}'"]
    source = "\n".join([*head, *lines, "    return (text + '}').encode()"])
    namespace: dict[str, Any] = {"_check_x": _check_x}
    exec(source, namespace)  # the source is built above from the struct's own field names and types
    return cast("Callable[P, bytes]", namespace["encode_x"])


encode_x = _x_writer(XMsg)
encode_x.__doc__ = (
    """``encode(XMsg(...))`` without building the struct (hot path): the same arguments, the same bytes."""
)


class StatusMsg(_Signed):
    """``P/R/node/{i}/status`` (retained). ``done`` carries the final x of every phase.

    ``leaving`` (a clean departure) carries in ``iterations`` the departure iteration T: x^(T-1)
    was the node's last x. ``running`` and ``done`` carry in ``departed`` the neighbours that have
    departed, ``{str(j): T}`` (:mod:`nlagg_node.departure`). ``run``: the run it is of, on a
    deployment's shared status topic (only there: :class:`topics`).
    """

    node: NodeId
    state: NodeState
    final: list[Finite] | None = None
    output: list[Finite] | None = None
    iterations: Annotated[int, Field(ge=0, le=MAX_ITERATIONS)] | None = None
    departed: dict[NodeKey, Iteration] | None = None
    chain: Annotated[str, _b64_of(16)] | None = None  # the anchor of its x's key chain (with identities)
    run: RunId | None = None


class AdvStateMsg(_Signed):
    """``P/R/adv/{i}/state``: a corrupted node's s_i and duals z_{i|j}^(t), z_{j|i}^(t) (keys: str(j))."""

    node: NodeId
    t: Iteration
    s: Finite
    z: dict[NodeKey, Finite]
    z_in: dict[NodeKey, Finite]


WireMessage = ConfigMsg | Z0Msg | SealedZ0Msg | XMsg | StatusMsg | AdvStateMsg | KeyMsg
Decoded = WireMessage  # what :func:`decode` and :class:`HotDecoder` return
_MODELS: dict[str, type[_Msg]] = {  # the pydantic ones; an x is :class:`XMsg`'s
    "config": ConfigMsg,
    "z0": Z0Msg,
    "status": StatusMsg,
    "adv": AdvStateMsg,
    "key": KeyMsg,
}
_V2 = re.compile(rb'"v"\s*:\s*2\s*[,}]')  # a z0 has no nested object: this is its version field


@dataclass(frozen=True)
class TopicInfo:
    """What a topic says: message kind, the publishing node (None for config), the peer (z0 only),
    whether it is a deployment's shared status or key topic (its payload names the run)."""

    kind: Kind
    node: int | None = None
    peer: int | None = None
    shared: bool = False


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is 1-64 characters of ``[A-Za-z0-9_-]``, else raise :class:`WireError`."""
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        raise WireError("run_id", run_id, "must be 1-64 characters of [A-Za-z0-9_-]")
    return run_id


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is one or more ``/``-separated levels of ``[A-Za-z0-9_-]``."""
    if not isinstance(prefix, str) or not PREFIX_RE.match(prefix):
        raise WireError("prefix", prefix, "must be levels of [A-Za-z0-9_-] separated by '/'")
    return prefix


class topics:  # noqa: N801 - a namespace of topic builders, read as topics.x(...)
    """Topic builders for one run: ``topics("nlagg", "r1").x(3) == "nlagg/r1/node/3/x"``.

    ``shared``: the run is an epoch of a continuous deployment (prefix ``P/R``): its status and key
    go on the topics every epoch shares, ``P/R/node/{i}/status`` and ``P/R/node/{i}/key``, and their
    payloads name the run (:attr:`named`). The one place that choice is made.
    """

    def __init__(self, prefix: str, run_id: str, *, shared: bool = False) -> None:
        self.base = f"{check_prefix(prefix)}/{check_run_id(run_id)}"
        self.retained_base = prefix if shared else self.base  # where status and key go
        self.named = run_id if shared else None  # the ``run`` a status or key payload carries

    @property
    def all(self) -> str:
        return f"{self.base}/#"

    @property
    def config(self) -> str:
        return f"{self.base}/config"

    def z0(self, i: int | str, j: int | str) -> str:
        return f"{self.base}/edge/{i}/{j}/z0"

    def x(self, i: int | str) -> str:
        return f"{self.base}/node/{i}/x"

    def x_batch(self, lo: int, hi: int) -> str:
        """The x's of the hosted nodes ``lo..hi`` (inclusive), coalesced (:class:`XBatchMsg`)."""
        return f"{self.base}/host/{lo}-{hi}/x"

    @property
    def x_batches(self) -> str:
        """Every host's coalesced x's."""
        return f"{self.base}/host/+/x"

    def status(self, i: int | str) -> str:
        return f"{self.retained_base}/node/{i}/status"

    def adv(self, i: int | str) -> str:
        return f"{self.base}/adv/{i}/state"

    def key(self, i: int | str) -> str:
        return f"{self.retained_base}/node/{i}/key"


def _node_id(part: str, field: str, topic: str) -> int:
    if not part.isdigit() or (len(part) > 1 and part[0] == "0") or len(part) > 9:
        raise WireError(field, topic, f"node id {part!r} is not a non-negative integer")
    return int(part)


def _shared_topic(topic: str, prefix: str) -> TopicInfo | None:
    """``P/node/{i}/status`` or ``P/node/{i}/key`` under ``prefix`` = ``P`` (a deployment's ``P/R``)."""
    parts = topic[len(prefix) + 1 :].split("/") if topic.startswith(f"{prefix}/") else []
    if len(parts) == 3 and parts[0] == "node" and parts[2] in ("status", "key"):
        kind: Kind = "status" if parts[2] == "status" else "key"
        return TopicInfo(kind, _node_id(parts[1], "topic", topic), shared=True)
    return None


@lru_cache(maxsize=4096)  # a run's topics repeat every iteration; errors are not cached
def parse_topic(topic: str, prefix: str, run_id: str) -> TopicInfo:
    """Classify a topic of run ``run_id`` (or a status or key topic that the epochs under ``prefix``
    share, :class:`topics`); raise :class:`WireError` for anything else."""
    base = f"{prefix}/{run_id}/"
    if not topic.startswith(base):
        shared = _shared_topic(topic, prefix)
        if shared is not None:
            return shared
        raise WireError("topic", topic, f"not under {base}")
    parts = topic[len(base) :].split("/")
    if parts == ["config"]:
        return TopicInfo("config")
    if len(parts) == 4 and parts[0] == "edge" and parts[3] == "z0":
        return TopicInfo("z0", _node_id(parts[1], "topic", topic), _node_id(parts[2], "topic", topic))
    if len(parts) == 3 and parts[0] == "node" and parts[2] in ("x", "status", "key"):
        kind: Kind = "x" if parts[2] == "x" else "status" if parts[2] == "status" else "key"
        return TopicInfo(kind, _node_id(parts[1], "topic", topic))
    if len(parts) == 3 and parts[0] == "adv" and parts[2] == "state":
        return TopicInfo("adv", _node_id(parts[1], "topic", topic))
    raise WireError("topic", topic, "not a topic of wire protocol v1 or v2")


def encode(msg: WireMessage) -> bytes:
    """UTF-8 JSON with shortest round-trip floats; raises :class:`WireError` on NaN/inf."""
    if isinstance(msg, XMsg):
        return encode_x(*msgspec.structs.astuple(msg))
    try:
        body = msg.model_dump(by_alias=True)
        if isinstance(msg, StatusMsg) and msg.departed is None:
            del body["departed"]  # statuses of a run without departures are as before
        for key in ("sig", "identities", "chain", "run", "instance", "launcher"):  # as before without them
            if body.get(key, 0) is None:
                del body[key]
        text = json.dumps(body, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        raise WireError(type(msg).__name__, msg, f"cannot encode ({exc})") from None
    return text.encode("utf-8")


def decode(topic: str, payload: bytes, prefix: str, run_id: str) -> tuple[TopicInfo, WireMessage]:
    """Parse and validate one message; check that its body agrees with its topic.

    Raises
    ------
    WireError
        Foreign topic, oversized or non-UTF-8 payload, invalid JSON, NaN/inf, a missing or
        wrong field (named with its value), or a body that contradicts the topic.
    """
    info = parse_topic(topic, prefix, run_id)
    return info, _decode_on(info, topic, payload)


def shared_run(topic: str, payload: bytes, prefix: str) -> str | None:
    """The run a status or key on a shared topic of the epochs under ``prefix`` (``P/R``) names;
    None for any other topic. Raises :class:`WireError` as :func:`decode` does."""
    info = _shared_topic(topic, prefix)
    if info is None:
        return None
    msg = _decode_on(info, topic, payload)
    assert isinstance(msg, StatusMsg | KeyMsg)  # _check_agrees refused a shared one without its run
    return msg.run


def stale_run(msg: Decoded, run_id: str) -> str | None:
    """The other run a status or key names (of another epoch, on a shared topic; a node's earlier
    retained status or key there), or None: it is of run ``run_id``, or names none."""
    run = msg.run if isinstance(msg, StatusMsg | KeyMsg) else None
    return run if run is not None and run != run_id else None


def _decode_on(info: TopicInfo, topic: str, payload: bytes) -> WireMessage:
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise WireError("payload", f"<{len(payload)} bytes>", f"larger than {MAX_PAYLOAD_BYTES} bytes")
    if info.kind == "x":
        return _decode_x(info, topic, payload)
    model = _MODELS[info.kind]
    if info.kind == "z0" and _V2.search(payload):  # the sealed z^(0) of protocol v2
        model = SealedZ0Msg
    try:
        # pydantic's own JSON parser: exact doubles (shortest-repr input round-trips), no NaN/inf tokens.
        msg: WireMessage = model.model_validate_json(payload)  # type: ignore[assignment]
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p)[:24] for p in err["loc"])  # a key of 5000 digits is not a field name
        if not loc or err["type"] in ("json_invalid", "json_type", "model_type", "model_attributes_type"):
            raise WireError(
                "payload", payload[:60], f"not a JSON object of protocol v1/v2 ({err['msg']})"
            ) from None
        raise WireError(loc, err.get("input"), err["msg"].removeprefix("Value error, ")) from None
    _check_agrees(info, msg, topic)
    return msg


_X_DECODE = msgspec.json.Decoder(XMsg).decode


def _decode_x(info: TopicInfo, topic: str, payload: bytes) -> XMsg:
    """``payload`` as an :class:`XMsg` of node ``info.node``, else the :class:`WireError` saying why not."""
    try:
        msg = _X_DECODE(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # ValidationError is a DecodeError
        raise _x_error(payload, exc) from None
    _check_x(msg.x, msg.cand, msg.departures)
    if msg.node != info.node:
        raise WireError("node", msg.node, f"disagrees with topic {topic}")
    return msg


def _x_error(payload: bytes, exc: Exception) -> WireError:
    """The field and value an x payload msgspec refused is wrong in (the error path only).

    msgspec names the field (``$.t``) but not the value, and refuses a NaN or infinity as bad JSON:
    the payload is read again by :func:`json.loads`, which takes both, and converted to
    :class:`XMsg` by the same schema, so a non-finite x is an error of field ``x``.
    """
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):  # nested deeper than json can read
        body = None
    if isinstance(body, dict):
        try:
            msg = msgspec.convert(body, XMsg)
            _check_x(msg.x, msg.cand, msg.departures)
        except WireError as error:
            return error
        except msgspec.ValidationError as error:
            exc = error
    reason, _, at = str(exc).partition(" - at `$")
    path = [p for p in re.split(r"[.\[\]]", at.rstrip("`")) if p]
    named = re.search(r"field `(.+)`$", reason)  # a missing or unknown field, named at the top
    if named:
        path.append(named.group(1))
    if not isinstance(body, dict) or not path:
        return WireError("payload", payload[:60], f"not a JSON object of protocol v1/v2 ({reason})")
    value: Any = body
    for part in path:
        value = value[int(part)] if isinstance(value, list) else value.get(part)
    return WireError(".".join(p[:24] for p in path), value, reason)  # a 5000-digit key is not a name


class HotDecoder:
    """:func:`decode` for one run, remembering the x topics already seen (at most :data:`MAX_NODES`).

    ``decode(topic, payload)`` returns what :func:`decode` returns and raises what it raises: an x
    goes to the same :class:`XMsg` decoder without classifying its topic again, and one it refuses
    to :func:`decode`, which says why.
    """

    def __init__(self, prefix: str, run_id: str) -> None:
        self.prefix, self.run_id = prefix, run_id
        self._x_topics: dict[str, TopicInfo] = {}

    def decode(self, topic: str, payload: bytes) -> tuple[TopicInfo, Decoded]:
        """Parse and validate one message (see the class)."""
        info = self._x_topics.get(topic)
        if info is not None and len(payload) <= MAX_PAYLOAD_BYTES:
            try:
                msg = _X_DECODE(payload)
            except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError is a DecodeError
                pass  # decode() below says why, in the same words
            else:
                _check_x(msg.x, msg.cand, msg.departures)
                if msg.node == info.node:
                    return info, msg
        info, full = decode(topic, payload, self.prefix, self.run_id)
        if info.kind == "x" and len(self._x_topics) < MAX_NODES:
            self._x_topics[topic] = info
        return info, full


class XBatchMsg(msgspec.Struct, tag_field="v", tag=1, frozen=True, forbid_unknown_fields=True, gc=False):
    """``P/R/host/{lo}-{hi}/x``: x's of the nodes ``lo..hi`` one process hosts, coalesced.

    Each item of ``xs`` is, byte for byte, the payload node i publishes alone on ``P/R/node/{i}/x``
    (in a run with identities its signature too, which binds that topic): kept as raw JSON, so a
    receiver reads and checks it as that message. Written by :func:`encode_x_batch`, read by
    :func:`split_x_batch`.
    """

    xs: Annotated[list[msgspec.Raw], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


@dataclass(frozen=True, slots=True)
class XItem:
    """One x of a host's batch, as its node would have published it alone: ``topic`` is
    ``P/R/node/{i}/x``, ``payload`` the item's exact bytes, ``msg`` them decoded and checked."""

    topic: str
    payload: bytes
    msg: XMsg


_BATCH_DECODE = msgspec.json.Decoder(XBatchMsg).decode
_HOST_RANGE = re.compile(r"^(0|[1-9][0-9]{0,8})-(0|[1-9][0-9]{0,8})$")


def encode_x_batch(items: Sequence[bytes]) -> bytes:
    """The :class:`XBatchMsg` of ``items`` (x payloads as :func:`encode_x` wrote them, signed or not)."""
    return b'{"v":1,"xs":[' + b",".join(items) + b"]}"


def batch_range(topic: str, prefix: str, run_id: str) -> tuple[int, int] | None:
    """The nodes ``(lo, hi)`` a host's batch topic ``P/R/host/{lo}-{hi}/x`` of the run names; None:
    ``topic`` is no host's topic. Raises :class:`WireError` for a malformed one."""
    base = f"{prefix}/{run_id}/host/"
    return _host_range(topic, len(base)) if topic.startswith(base) else None


@lru_cache(maxsize=256)  # a host's topic repeats every iteration; errors are not cached
def _host_range(topic: str, cut: int) -> tuple[int, int]:
    found = _HOST_RANGE.match(topic[cut:-2]) if topic.endswith("/x") else None
    if found is None:
        raise WireError("topic", topic, "a host's x's go on host/{lo}-{hi}/x (node ids in decimal)")
    lo, hi = int(found.group(1)), int(found.group(2))
    if not lo <= hi < MAX_NODES:
        raise WireError("topic", topic, f"the range lo-hi must be ascending node ids below {MAX_NODES}")
    return lo, hi


def split_x_batch(
    topic: str, payload: bytes, prefix: str, run_id: str
) -> tuple[list[XItem], list[tuple[bytes, WireError]]] | None:
    """A host's batch on ``topic`` as the x's it carries, and the items refused (each with why);
    None: ``topic`` is no host's batch topic.

    Each item is decoded and checked as :func:`decode` checks an x on its node's topic, except that
    its node must lie in the topic's range (the host's nodes) instead of equal the topic's: an item
    of another node is refused, named, the others kept. Raises :class:`WireError` (the item named
    ``xs[k]``) for a batch that does not decode as a whole, or one of whose items does not.
    """
    hosts = batch_range(topic, prefix, run_id)
    if hosts is None:
        return None
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise WireError("payload", f"<{len(payload)} bytes>", f"larger than {MAX_PAYLOAD_BYTES} bytes")
    try:
        batch = _BATCH_DECODE(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise WireError("payload", payload[:60], f"not a host's x batch ({exc})") from None
    lo, hi = hosts
    base = f"{prefix}/{run_id}/node/"
    items: list[XItem] = []
    refused: list[tuple[bytes, WireError]] = []
    for k, raw in enumerate(batch.xs):
        item = bytes(raw)
        try:
            msg = _X_DECODE(item)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            error = _x_error(item, exc)
            raise WireError(f"xs[{k}].{error.field}", error.value, error.reason) from None
        try:
            _check_x(msg.x, msg.cand, msg.departures)
        except WireError as error:
            raise WireError(f"xs[{k}].{error.field}", error.value, error.reason) from None
        if lo <= msg.node <= hi:
            items.append(XItem(f"{base}{msg.node}/x", item, msg))
        else:
            why = f"not a node of host {lo}-{hi} ({topic}); refused"
            refused.append((item, WireError(f"xs[{k}].node", msg.node, why)))
    return items, refused


def _check_agrees(info: TopicInfo, msg: WireMessage, topic: str) -> None:
    if isinstance(msg, Z0Msg | SealedZ0Msg):
        if (msg.from_, msg.to) != (info.node, info.peer):
            raise WireError("from/to", (msg.from_, msg.to), f"disagrees with topic {topic}")
        if msg.from_ == msg.to:
            raise WireError("to", msg.to, "a node has no edge to itself")
    elif isinstance(msg, StatusMsg | AdvStateMsg | KeyMsg):
        if msg.node != info.node:
            raise WireError("node", msg.node, f"disagrees with topic {topic}")
        if isinstance(msg, StatusMsg | KeyMsg) and (msg.run is None) == info.shared:
            why = "must name its run on a shared topic" if info.shared else "only on a shared topic"
            raise WireError("run", msg.run, f"{why} ({topic})")
    elif isinstance(msg, ConfigMsg) and msg.run_id != topic.split("/")[-2]:
        raise WireError("run_id", msg.run_id, f"disagrees with topic {topic}")
