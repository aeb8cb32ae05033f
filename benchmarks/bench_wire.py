"""Cost of reading and writing one x message: the pydantic models against the hot path, in one process.

    python benchmarks/bench_wire.py [--number 20000] [--repeat 5]

* decode: :func:`~nlagg_node.runtime.wire.decode` (pydantic, the validation boundary) against
  :class:`~nlagg_node.runtime.wire.HotDecoder` (msgspec :class:`~nlagg_node.runtime.wire.XWire`),
  topic check, size limit, every field bound and the node/topic agreement included;
* encode: ``encode(XMsg(...))`` against :func:`~nlagg_node.runtime.wire.encode_x`, the same bytes.

Each is timed in CPU time (``time.process_time``) ``--repeat`` times, interleaved, and the best of
each compared (the machine is shared). Prints one JSON line per case: microseconds per message
and the ratio (target >= 5).
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
from collections.abc import Callable

from nlagg_node.runtime.wire import HotDecoder, XMsg, decode, encode, encode_x, topics


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
    decode_hot = HotDecoder("nlagg", "bench").decode
    hot, full = decode_hot(topic, payload)[1], decode(topic, payload, "nlagg", "bench")[1]
    assert (hot.x, hot.t, hot.quiet, hot.stop) == (full.x, full.t, full.quiet, full.stop)  # type: ignore[union-attr]
    dec = {
        "pydantic": lambda: decode(topic, payload, "nlagg", "bench"),
        "hot": lambda: decode_hot(topic, payload),
    }
    enc = {
        "pydantic": lambda: encode(XMsg(node=node, t=t, phase=phase, x=x, quiet=quiet, stop=stop)),
        "hot": lambda: encode_x(node, t, phase, x, quiet, stop),
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
            row = {
                "case": case,
                "what": what,
                "pydantic_us": round(got["pydantic"] * 1e6, 3),
                "hot_us": round(got["hot"] * 1e6, 3),
                "ratio": round(got["pydantic"] / got["hot"], 1),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
