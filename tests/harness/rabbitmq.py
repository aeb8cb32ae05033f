"""A private RabbitMQ cluster with the MQTT plugin on loopback, for tests (Debian's ``rabbitmq-server``).

:func:`start_rabbitmq_cluster` runs ``members`` RabbitMQ nodes as the current user (root, without
systemd), each with its own node name, ports, data, log, config and enabled-plugins files under one
temporary directory, a private Erlang port mapper (``ERL_EPMD_PORT``: a free port, never the
system's 4369) and a shared Erlang cookie (``HOME`` is that directory). The members after the first
join the first (``stop_app``, ``join_cluster``, ``start_app``). Every process the cluster started
(``beam.smp``, ``epmd``, ``erl_child_setup``, ``inet_gethost``) carries that ``HOME`` in its
environment; on exit the members are stopped with ``rabbitmqctl stop`` and whatever is left of
those processes is killed, by pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from nlagg_node.errors import BrokerError
from nlagg_node.runtime.brokers import LOOPBACK, free_port, port_open

__all__ = ["RabbitCluster", "rabbitmq_scripts", "start_rabbitmq_cluster"]

SCRIPTS = Path("/usr/lib/rabbitmq/bin")  # Debian's; /usr/sbin/rabbitmq-server would su to user rabbitmq


def rabbitmq_scripts() -> Path | None:
    """The folder of ``rabbitmq-server`` and ``rabbitmqctl``, or None when RabbitMQ is not installed."""
    ok = all(os.access(SCRIPTS / s, os.X_OK) for s in ("rabbitmq-server", "rabbitmqctl"))
    return SCRIPTS if ok else None


def _config(amqp: int, mqtt: int, store: str) -> str:
    return "\n".join(
        [
            f"listeners.tcp.default = {LOOPBACK}:{amqp}",
            f"mqtt.listeners.tcp.default = {LOOPBACK}:{mqtt}",
            "mqtt.tcp_listen_options.nodelay = true",
            # anonymous MQTT clients act as guest, whom RabbitMQ admits only over loopback
            "mqtt.allow_anonymous = true",
            "mqtt.default_user = guest",
            "mqtt.default_pass = guest",
            "mqtt.vhost = /",
            "mqtt.exchange = amq.topic",
            "mqtt.subscription_ttl = 86400000",  # persistent sessions: queues outlive the connection
            "mqtt.prefetch = 0",  # no cap on unacknowledged QoS 1 deliveries per subscriber
            f"mqtt.retained_message_store = {store}",
            "loopback_users.guest = true",
            "log.console = false",
            "log.file.level = info",
            "",
        ]
    )


@dataclass
class RabbitCluster:
    """The running members: ``urls[k]`` is member k's MQTT listener."""

    base: Path
    names: list[str]
    urls: list[str]
    env: dict[str, str]
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    version: str = ""

    async def ctl(self, member: int, *args: str, within: float = 120.0) -> str:
        """``rabbitmqctl -n <member> args``; its output, or :class:`BrokerError` when it fails."""
        proc = await asyncio.create_subprocess_exec(
            str(SCRIPTS / "rabbitmqctl"),
            "-n",
            self.names[member],
            *args,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(within):
                out, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise BrokerError(
                f"rabbitmqctl {' '.join(args)} on {self.names[member]}: no answer in {within:g} s"
            ) from None
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise BrokerError(f"rabbitmqctl {' '.join(args)} on {self.names[member]} failed: {text[-1500:]}")
        return text

    def log(self, member: int) -> str:
        """The tail of member ``member``'s logs (its startup output and its log file)."""
        folder = self.base / f"m{member}"
        text = "".join(p.read_text(errors="replace") for p in sorted(folder.glob("log/*.log")))
        out = folder / "stdout"
        return ((out.read_text(errors="replace") if out.exists() else "") + text)[-3000:]


def _ours(marker: str) -> list[int]:
    """Pids of the processes whose environment holds ``marker`` (this cluster's HOME)."""
    needle = marker.encode() + b"\0"
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
    return pids


async def _kill_leftovers(marker: str, within: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, every process still carrying ``marker`` (epmd above all)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _ours(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        for _ in range(int(within / 0.1)):  # polled: nothing tells us when a foreign process is gone
            if not _ours(marker):
                return
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def start_rabbitmq_cluster(
    members: int = 2,
    *,
    workdir: str | os.PathLike[str] | None = None,
    retained_store: str = "rabbit_mqtt_retained_msg_store_dets",
    ready_timeout: float = 180.0,
) -> AsyncIterator[RabbitCluster]:
    """Run a cluster of ``members`` RabbitMQ nodes (MQTT plugin on) for the ``with`` block.

    Raises :class:`BrokerError` (with the member's log) when RabbitMQ is missing, a member does not
    start within ``ready_timeout`` seconds, or a join fails; what started is stopped first.
    """
    if rabbitmq_scripts() is None:
        raise BrokerError("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
    with contextlib.ExitStack() as stack:
        if workdir is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nlagg-rabbitmq-")))
        else:
            base = Path(workdir)
            base.mkdir(parents=True, exist_ok=True)
        cookie = base / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        (base / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(base),  # the cookie, and the marker of every process the cluster starts
            "LANG": "C.UTF-8",
            "ERL_EPMD_PORT": str(free_port()),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
        }
        marker = f"HOME={base}"
        names = [f"nlagg{k}-{base.name.rsplit('-', 1)[-1].lower()}@localhost" for k in range(members)]
        mqtt_ports = [free_port() for _ in range(members)]
        cluster = RabbitCluster(base, names, [f"mqtt://{LOOPBACK}:{p}" for p in mqtt_ports], env)
        try:
            for k in range(members):
                folder = base / f"m{k}"
                (folder / "log").mkdir(parents=True)
                (folder / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
                amqp = free_port()
                (folder / "rabbitmq.conf").write_text(_config(amqp, mqtt_ports[k], retained_store))
                node_env = env | {
                    "RABBITMQ_NODENAME": names[k],
                    "RABBITMQ_NODE_PORT": str(amqp),
                    "RABBITMQ_DIST_PORT": str(free_port()),
                    "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
                    "RABBITMQ_LOG_BASE": str(folder / "log"),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
                    "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
                    "RABBITMQ_PID_FILE": str(folder / "pid"),
                }
                with (folder / "stdout").open("wb") as out:
                    cluster.procs.append(
                        await asyncio.create_subprocess_exec(
                            str(SCRIPTS / "rabbitmq-server"),
                            env=node_env,
                            cwd=folder,
                            stdin=asyncio.subprocess.DEVNULL,
                            stdout=out,
                            stderr=out,
                            start_new_session=True,
                        )
                    )
            for k in range(members):
                await _await_startup(cluster, k, ready_timeout)
            for k in range(1, members):
                await cluster.ctl(k, "stop_app")
                await cluster.ctl(k, "join_cluster", names[0])
                await cluster.ctl(k, "start_app")
                await _await_startup(cluster, k, ready_timeout)
            for k, port in enumerate(mqtt_ports):
                deadline = time.monotonic() + ready_timeout
                while not await port_open(LOOPBACK, port):
                    if time.monotonic() > deadline:
                        raise BrokerError(f"{names[k]}: MQTT port {port} never opened: {cluster.log(k)}")
                    await asyncio.sleep(0.2)
            status = await cluster.ctl(0, "cluster_status", "--formatter", "json")
            missing = [name for name in names if f'"{name}"' not in status]
            if missing:
                raise BrokerError(f"{missing} not in the cluster: {status[-1500:]}")
            cluster.version = (await cluster.ctl(0, "version")).strip().splitlines()[-1]
            yield cluster
        finally:
            await _stop(cluster, marker)


async def _await_startup(cluster: RabbitCluster, k: int, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        if k < len(cluster.procs) and cluster.procs[k].returncode is not None:
            raise BrokerError(
                f"{cluster.names[k]} exited with {cluster.procs[k].returncode}: {cluster.log(k)}"
            )
        try:
            await cluster.ctl(k, "await_startup", "--timeout", "30", within=60)
            return
        except BrokerError:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"{cluster.names[k]} not started within {within:g} s: {cluster.log(k)}"
                ) from None
            await asyncio.sleep(1.0)


async def _stop(cluster: RabbitCluster, marker: str) -> None:
    """``rabbitmqctl stop`` every member (the last joined first), then kill what is left, by pid."""
    for k in reversed(range(len(cluster.procs))):
        proc = cluster.procs[k]
        if proc.returncode is None:
            with contextlib.suppress(BrokerError):
                await cluster.ctl(k, "stop", within=60)
            try:
                async with asyncio.timeout(30):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
    await _kill_leftovers(marker)
