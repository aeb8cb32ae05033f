"""Every error nlagg raises on purpose, in one tree.

::

    NlaggError                        base: the CLI prints its message on one line (exit 1)
    ├── ConfigError (ValueError)      bad input, naming the field and the value received (exit 2)
    │   └── ConfigMismatchError       this node's config contradicts the run's retained P/R/config
    ├── WireError                     a message that does not follow wire protocol v1
    ├── BrokerError                   a broker could not be started or used
    │   ├── BrokerRefusedError        it answered the CONNECT (or SUBSCRIBE) with a refusal code
    │   └── BrokerUnreachableError    no connection after every retry (or within the time given)
    ├── NeighbourTimeoutError         a neighbour did not deliver within the barrier timeout
    ├── DepartedError                 this node came back after its neighbours counted it as departed
    ├── StoppedBySignal               Ctrl-C, SIGTERM or SIGHUP stopped the run, after its clean-up (128+n)
    └── TestbedError                  a testbed's node process failed or the run did not complete
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BrokerError",
    "BrokerRefusedError",
    "BrokerUnreachableError",
    "ConfigError",
    "ConfigMismatchError",
    "DepartedError",
    "EquivocationError",
    "NeighbourTimeoutError",
    "NlaggError",
    "SealError",
    "StopRequested",
    "StoppedBySignal",
    "TestbedError",
    "WireError",
]


class NlaggError(Exception):
    """Base class of every error nlagg raises on purpose."""


class _FieldError(NlaggError):
    """An error about one named field and the value received: ``field=value: reason``."""

    def __init__(self, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={self._shown(value)}: {reason}")

    @staticmethod
    def _shown(value: Any) -> str:
        return repr(value)


class ConfigError(_FieldError, ValueError):
    """A run configuration, graph file or command-line value is invalid.

    The message always names the field and the value received, so a one-line
    report on stderr tells the user what to fix.
    """


class ConfigMismatchError(ConfigError):
    """This node's configuration contradicts the run's retained ``P/R/config`` on the broker."""


class WireError(_FieldError):
    """A message that does not follow wire protocol v1; names the field and the value received.

    The value is shown cut to 80 characters: a hostile payload must not flood the log.
    """

    @staticmethod
    def _shown(value: Any) -> str:
        shown = repr(value)
        return shown[:77] + "..." if len(shown) > 80 else shown


class SealError(WireError):
    """A sealed z^(0) (protocol v2) that does not open: wrong key, tampered, or replayed from another
    run, edge or dual group (:mod:`nlagg_node.runtime.seal`)."""


class BrokerError(NlaggError):
    """A broker could not be started (binary failed, port never opened) or used by a client."""


class BrokerRefusedError(BrokerError):
    """The broker refused this client: a CONNACK (or SUBACK) refusal, kept as its MQTT return code.

    Parameters
    ----------
    url, client_id : the broker and the client it refused.
    code : the MQTT return code (CONNACK 1-5 in MQTT 3.1.1, a reason code >= 0x80 in MQTT 5;
        0x80 for a refused subscription).
    reason : the code in words.
    """

    def __init__(self, url: str, client_id: str, code: int, reason: str) -> None:
        self.url = url
        self.client_id = client_id
        self.code = code
        self.reason = reason
        super().__init__(f"broker {url} refused client {client_id!r}: {reason} (return code {code})")


class BrokerUnreachableError(BrokerError):
    """No connection to the broker after ``tries`` attempts (nothing listening, or each one failed).

    ``last`` is what the last attempt ended with, when the client knows it.
    """

    def __init__(self, url: str, tries: int, last: str = "") -> None:
        self.url = url
        self.tries = tries
        self.last = last
        super().__init__(
            f"cannot connect to broker {url} after {tries} tries" + (f": {last}" if last else "")
        )


class NeighbourTimeoutError(NlaggError):
    """A neighbour did not deliver what the barrier waits for within the configured timeout."""


class TestbedError(NlaggError):
    """A testbed's node process failed or the run did not complete."""

    __test__ = False  # not a pytest test class, whatever its name


class DepartedError(NlaggError):
    """This node came back after its neighbours had counted it as departed: refused for the run."""


class StopRequested(NlaggError):  # noqa: N818 - a reason to stop, not a fault
    """A node was told to stop (a SIGTERM) where it has nothing to leave cleanly: while it waited for
    an epoch's start, or before it published its first x (it is stopped outright)."""


class EquivocationError(NlaggError):
    """A node published two different messages for one slot: the run ends, naming it
    (:func:`nlagg_node.protocol.equivocation_error`)."""

    def __init__(self, node: int, why: str) -> None:
        self.node = node
        super().__init__(why)


class StoppedBySignal(NlaggError):  # noqa: N818 - a reason to stop, not a fault
    """SIGINT, SIGTERM or SIGHUP cancelled the run, whose clean-up has run (:mod:`nlagg_node.lifetime`)."""

    def __init__(self, signum: int, partial: Any = None) -> None:
        import signal
        from pathlib import Path

        self.signum = signum
        self.partial = partial  # the command's output folder or file, or None
        name = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        left = partial is not None and _holds_files(Path(partial))
        super().__init__(f"{name}; " + (f"partial results in {partial}" if left else "nothing left behind"))


def _holds_files(path: Any) -> bool:
    """Whether ``path`` is a file or a folder with a file in it."""
    return bool(path.is_file() or any(p.is_file() for p in path.rglob("*")))
