"""Private MQTT brokers on loopback: a real Mosquitto when the binary exists, else an embedded amqtt broker.

Both are async context managers yielding a :class:`BrokerHandle` whose ``url`` (``mqtt://127.0.0.1:PORT``)
is what nodes, the eavesdropper and tests connect to. Nothing here binds anything but 127.0.0.1.

Examples
--------
>>> async with start_mosquitto(extra_config="broker/acl-test.conf") as broker:   # doctest: +SKIP
...     print(broker.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from ..errors import BrokerError, ConfigError
from ..lifetime import owned_tempdir, parent_death_signal

__all__ = [
    "BrokerHandle",
    "BrokerKind",
    "free_port",
    "mosquitto_binary",
    "port_open",
    "start_amqtt",
    "start_broker",
    "start_mosquitto",
]

log = logging.getLogger(__name__)

BrokerKind = Literal["mosquitto", "amqtt"]
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class BrokerHandle:
    """A running private broker.

    Attributes
    ----------
    kind : "mosquitto" or "amqtt".
    host, port : where it listens (always loopback).
    config_path : the Mosquitto configuration file written for it (None for amqtt).
    log_path : Mosquitto's log file (None for amqtt).
    pid : the Mosquitto process (None for amqtt, which runs in this process).
    """

    kind: BrokerKind
    host: str
    port: int
    config_path: Path | None = None
    log_path: Path | None = None
    pid: int | None = None

    @property
    def url(self) -> str:
        """``mqtt://host:port``, the form every nlagg command accepts as ``--broker``."""
        return f"mqtt://{self.host}:{self.port}"


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port that was free on ``host`` a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def mosquitto_binary() -> str | None:
    """Path of the ``mosquitto`` executable (PATH, then /usr/sbin and /usr/local/sbin), or None."""
    found = shutil.which("mosquitto")
    if found:
        return found
    for candidate in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


async def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    try:
        _reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _mosquitto_config(port: int, extra_text: str, extra_lines: Sequence[str], allow_anonymous: bool) -> str:
    extra_all = extra_text + "\n" + "\n".join(extra_lines)
    lines = [
        "# written by nlagg_node.runtime.brokers: private loopback broker",
        "per_listener_settings false",
        "persistence false",
        "set_tcp_nodelay true",
        "max_inflight_messages 0",
        # A high bound on what waits for a slow subscriber: the eavesdropper (niced) may lag the nodes
        # by many rounds, and the bound drops the rest for it (at 100,000, n = 200 nodes on 2 loaded
        # cores outran it: its transcript lost x's and never saw every 'done'). Memory follows its lag.
        # Not 0 ("no limit"): Mosquitto 2.0 then drops QoS 0 messages (eclipse-mosquitto issues 1956, 2879).
        "max_queued_messages 10000000",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        "log_type notice",
        f"listener {port} {LOOPBACK}",
    ]
    if os.geteuid() == 0 and not _mentions(extra_all, "user"):
        # Started as root, Mosquitto switches to its own user, and a process that changes its user
        # loses its parent-death signal: a SIGKILLed launcher would leave it running.
        lines.append("user root")
    if not _mentions(extra_all, "allow_anonymous"):
        lines.append(f"allow_anonymous {'true' if allow_anonymous else 'false'}")
    lines.append("# --- extra configuration ---")
    lines.append(extra_all.strip())
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def start_mosquitto(
    *,
    port: int | None = None,
    extra_config: str | os.PathLike[str] | None = None,
    extra_lines: Sequence[str] = (),
    allow_anonymous: bool = True,
    binary: str | None = None,
    workdir: str | os.PathLike[str] | None = None,
    ready_timeout: float = 10.0,
) -> AsyncIterator[BrokerHandle]:
    """Run a private Mosquitto on a free loopback port (``set_tcp_nodelay true``) for the ``with`` block.

    Parameters
    ----------
    port : port to listen on; a free one when None (retried on a lost race).
    extra_config : a Mosquitto configuration file whose text is appended after the generated listener
        (e.g. ``password_file``, ``acl_file``, ``allow_anonymous false``). Relative paths inside it are
        resolved by Mosquitto against its working directory, so prefer absolute paths.
    extra_lines : more configuration lines appended after ``extra_config``.
    allow_anonymous : written as ``allow_anonymous`` unless the extra configuration sets it itself.
    binary : the mosquitto executable; found with :func:`mosquitto_binary` when None.
    workdir : where the config and log files go; a temporary directory removed on exit when None.
    ready_timeout : seconds to wait for the port to accept connections.

    Raises
    ------
    BrokerError
        No binary, the process exited early (its log is quoted), or the port never opened.
    ConfigError
        ``extra_config`` does not exist.
    """
    exe = binary or mosquitto_binary()
    if exe is None:
        raise BrokerError("mosquitto binary not found (apt-get install mosquitto); use start_amqtt instead")
    extra_text = _read_extra(extra_config)
    with contextlib.ExitStack() as stack:
        if workdir is None:
            base = stack.enter_context(owned_tempdir("mosquitto"))
        else:
            base = Path(workdir)
            base.mkdir(parents=True, exist_ok=True)
        attempts = 1 if port is not None else 5
        last_error = ""
        for _attempt in range(attempts):
            chosen = port if port is not None else free_port()
            conf, log_path = _write_config(
                base, chosen, _mosquitto_config(chosen, extra_text, extra_lines, allow_anonymous)
            )
            with _open_log(log_path) as log_file:
                proc = await asyncio.create_subprocess_exec(
                    exe,
                    "-c",
                    str(conf),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    cwd=str(base),
                    start_new_session=True,
                    preexec_fn=parent_death_signal(),
                )
            ready = await _wait_ready(proc, chosen, ready_timeout)
            if not ready:
                await _stop_process(proc)
                last_error = _read_log(log_path)
                continue
            handle = BrokerHandle("mosquitto", LOOPBACK, chosen, conf, log_path, proc.pid)
            log.info("mosquitto (pid %d) listening on %s", proc.pid, handle.url)
            try:
                yield handle
            finally:
                await _stop_process(proc)
            return
        raise BrokerError(f"mosquitto did not start (config in {base}): {last_error or 'port never opened'}")


def _mentions(config: str, option: str) -> bool:
    return any(line.split()[:1] == [option] for line in config.splitlines())


def _read_extra(extra_config: str | os.PathLike[str] | None) -> str:
    if extra_config is None:
        return ""
    extra_path = Path(extra_config)
    if not extra_path.is_file():
        raise ConfigError("extra_config", str(extra_config), "no such file")
    return extra_path.read_text(encoding="utf-8")


def _write_config(base: Path, port: int, text: str) -> tuple[Path, Path]:
    conf = base / f"mosquitto-{port}.conf"
    conf.write_text(text, encoding="utf-8")
    return conf, base / f"mosquitto-{port}.log"


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # closed by the caller's with-block


def _read_log(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace").strip()


async def _wait_ready(proc: asyncio.subprocess.Process, port: int, within: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if proc.returncode is not None:
            return False
        if await port_open(LOOPBACK, port):
            return proc.returncode is None
        await asyncio.sleep(0.02)
    return False


async def _stop_process(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(5.0):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def amqtt_config(port: int, allow_anonymous: bool = True) -> dict[str, Any]:
    """Minimal amqtt configuration: one TCP listener on loopback, anonymous auth, no $SYS, no logging."""
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{LOOPBACK}:{port}", "max_connections": 0}},
        "timeout_disconnect_delay": 0,
        "plugins": {
            "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": allow_anonymous},
        },
    }


@asynccontextmanager
async def start_amqtt(*, port: int | None = None) -> AsyncIterator[BrokerHandle]:
    """Run an embedded amqtt broker in this event loop on a free loopback port for the ``with`` block."""
    from amqtt.broker import Broker

    chosen = port if port is not None else free_port()
    # amqtt logs every connection at INFO; keep the launcher's output readable.
    for name in ("amqtt", "transitions"):
        logging.getLogger(name).setLevel(logging.WARNING)
    broker = Broker(amqtt_config(chosen))
    await broker.start()  # returns once the listener is bound
    try:
        handle = BrokerHandle("amqtt", LOOPBACK, chosen)
        log.info("embedded amqtt broker listening on %s", handle.url)
        yield handle
    finally:
        await _shutdown_amqtt(broker)


async def _shutdown_amqtt(broker: Any, within: float = 3.0) -> None:
    """Stop amqtt within ``within`` s, quietly: its shutdown waits up to 5 s per stage for clients
    (and warns about each) that are gone or going anyway, since the run is over."""
    amqtt_log = logging.getLogger("amqtt")
    level = amqtt_log.level
    amqtt_log.setLevel(logging.CRITICAL)
    try:
        async with asyncio.timeout(within):
            await broker.shutdown()
    except (Exception, TimeoutError) as exc:  # the listener goes with this process either way
        log.debug("embedded amqtt broker: shutdown cut short (%r)", exc)
    finally:
        amqtt_log.setLevel(level)


@asynccontextmanager
async def start_broker(kind: Literal["auto", "mosquitto", "amqtt"] = "auto") -> AsyncIterator[BrokerHandle]:
    """Start the testbed's private broker: Mosquitto when installed (``auto``), else embedded amqtt."""
    if kind not in ("auto", "mosquitto", "amqtt"):
        raise ConfigError("broker_kind", kind, "expected auto, mosquitto or amqtt")
    use_mosquitto = kind == "mosquitto" or (kind == "auto" and mosquitto_binary() is not None)
    if use_mosquitto:
        async with start_mosquitto() as handle:
            yield handle
    else:
        async with start_amqtt() as handle:
            yield handle
