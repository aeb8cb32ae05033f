"""Cost of reading and writing one x message with its one codec (:class:`~nlagg_node.runtime.wire.XMsg`).

    python benchmarks/bench_wire.py [--number 20000] [--repeat 5]

* decode: :class:`~nlagg_node.runtime.wire.HotDecoder` (a topic seen before: the hot path) and
  :func:`~nlagg_node.runtime.wire.decode` (topic classified too), size limit, every field bound and
  the node/topic agreement included, against the standard library's ``json.loads`` of the same
  payload (no validation at all);
* encode: :func:`~nlagg_node.runtime.wire.encode_x` (its checks and the bytes; what a node calls)
  against ``json.dumps`` of the same fields, the bytes it must equal.

Each is timed in CPU time (``time.process_time``) ``--repeat`` times, interleaved, and the best of
each compared (the machine is shared). Prints one JSON line per case: microseconds per message
and the ratio of ``json`` to the codec.
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from collections.abc import Callable

from nlagg_node.runtime.wire import HotDecoder, decode, encode_x, topics


def _best(fns: dict[str, Callable[[], object]], number: int, repeat: int) -> dict[str, float]:
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit.Timer(fn, timer=time.process_time).timeit(number) / number)
    return best


def _case(
    fields: tuple[int, int, str, float, int | None, int | None], number: int, repeat: int
) -> dict[str, dict[str, float]]:
    node, t, phase, x, quiet, stop = fields
    topic = topics("nlagg", "bench").x(node)
    payload = encode_x(node, t, phase, x, quiet, stop)
    body = {k: v for k, v in json.loads(payload).items() if v is not None}
    assert json.dumps(body, separators=(",", ":")).encode() == payload
    decode_hot = HotDecoder("nlagg", "bench").decode
    assert decode_hot(topic, payload)[1] == decode(topic, payload, "nlagg", "bench")[1]
    dec = {
        "hot": lambda: decode_hot(topic, payload),
        "first": lambda: decode(topic, payload, "nlagg", "bench"),
        "json": lambda: json.loads(payload),
    }
    enc = {
        "hot": lambda: encode_x(node, t, phase, x, quiet, stop),
        "json": lambda: json.dumps(body, separators=(",", ":")).encode(),
    }
    return {"decode": _best(dec, number, repeat), "encode": _best(enc, number, repeat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cases: dict[str, tuple[int, int, str, float, int | None, int | None]] = {
        "x": (7, 123456, "max", -0.30000000000000004, None, None),
        "x+quiet+stop": (7, 123456, "topk-2", 1.2345678901234567e-5, 4321, 123700),
    }
    for case, fields in cases.items():
        for what, got in _case(fields, args.number, args.repeat).items():
            row = {"case": case, "what": what, **{f"{k}_us": round(v * 1e6, 3) for k, v in got.items()}}
            print(json.dumps({**row, "json/hot": round(got["json"] / got["hot"], 1)}), flush=True)


if __name__ == "__main__":
    main()
