"""Network namespaces for the multi-host and multi-site tests: a bridge, one namespace per host.

Topology: a switch namespace holding a Linux bridge, and one namespace per host joined to it by a
veth pair. Addresses are chosen inside these namespaces only (10.213.77.0/24); nothing is configured
in the root namespace. Impaired links (the multi-host test's node links) get 5 ms +- 2 ms of delay
and 1 % loss in each direction: ``tc netem`` when the kernel has it, otherwise the same impairment
built from what minimal kernels do have (iptables ``statistic`` drops in the kernel and an NFQUEUE
delayer, tests/harness/netem_nfqueue.py, on the bridge ports).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["BROKER_IP", "EAVES_IP", "SUBNET", "Net", "namespaces", "network", "unavailable"]

SUBNET = "10.213.77"
BROKER_IP = f"{SUBNET}.1"
EAVES_IP = f"{SUBNET}.2"
DELAY_MS, JITTER_MS, LOSS = 5.0, 2.0, 0.01
NFQUEUE_HELPER = Path(__file__).with_name("netem_nfqueue.py")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "needs root (ip netns, veth, bridge, tc)"
    missing = [b for b in ("ip", "tc", "mosquitto", "mosquitto_pub", "mosquitto_sub") if not shutil.which(b)]
    if missing:
        return (
            f"missing binaries: {', '.join(missing)} (apt-get install iproute2 mosquitto mosquitto-clients)"
        )
    probe = f"nlagg-probe-{uuid.uuid4().hex[:6]}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        bridge = run("ip", "-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if bridge.returncode != 0:
            return f"cannot create a bridge: {bridge.stderr.strip()}"
    finally:
        run("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class Net:
    """The namespaces, their addresses, and the processes started in them."""

    tag: str
    hosts: dict[str, str]  # namespace -> address
    switch: str
    impairment: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def ns(self, role: str) -> str:
        return f"{self.tag}-{role}"

    def address(self, role: str) -> str:
        return self.hosts[self.ns(role)]

    def argv(self, role: str, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``role``'s namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns(role), *argv]

    def popen(
        self,
        role: str,
        command: str,
        cwd: Path,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Run a shell command line inside host ``role``'s namespace (own process group).

        Output goes to pipes, or both streams to the file ``log`` (for long-running parts).
        """
        argv = self.argv(role, ["sh", "-c", command])
        with contextlib.ExitStack() as stack:
            sink = stack.enter_context(open(log, "wb")) if log is not None else subprocess.PIPE
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdout=sink,
                stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def run(self, role: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(role, argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        self.procs.clear()


def ip(*args: str) -> None:
    run("ip", *args)


def impair(net: Net, port: str, host_ns: str) -> None:
    """Delay and loss on both directions of one node link (host eth0 egress and bridge-port egress)."""
    netem = ["netem", "delay", f"{DELAY_MS:g}ms", f"{JITTER_MS:g}ms", "loss", f"{LOSS * 100:g}%"]
    if net.impairment in ("", "tc netem"):
        a = run(
            "ip", "netns", "exec", host_ns, "tc", "qdisc", "add", "dev", "eth0", "root", *netem, check=False
        )
        if a.returncode == 0:
            run("ip", "netns", "exec", net.switch, "tc", "qdisc", "add", "dev", port, "root", *netem)
            net.impairment = "tc netem"
            return
        if shutil.which("iptables") is None:
            pytest.skip("the kernel has no sch_netem and iptables (the fallback impairment) is not installed")
        net.impairment = "iptables statistic loss + NFQUEUE delay (kernel without sch_netem)"
    ipt = ["ip", "netns", "exec", net.switch, "iptables", "-A", "FORWARD", "-m", "physdev"]
    for direction in ("--physdev-in", "--physdev-out"):
        run(
            *ipt,
            direction,
            port,
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            str(LOSS),
            "-j",
            "DROP",
        )
        run(*ipt, direction, port, "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass")


@contextlib.contextmanager
def namespaces(n_nodes: int) -> Iterator[Net]:
    """A switch namespace with a bridge, and the broker, the eavesdropper and ``n_nodes`` nodes each
    in its own namespace, node links impaired; every namespace and process removed on exit."""
    nodes = {f"n{i}": f"{SUBNET}.{10 + i}" for i in range(n_nodes)}
    with network({"broker": BROKER_IP, "eaves": EAVES_IP, **nodes}, impaired=nodes) as net:
        yield net


@contextlib.contextmanager
def network(roles: Mapping[str, str], impaired: Collection[str] = ()) -> Iterator[Net]:
    """A switch namespace with a bridge, and one namespace per role of ``roles`` (role -> its address
    in ``SUBNET``.0/24), the links of the roles in ``impaired`` delayed and lossy; every namespace
    and every process started through the returned Net removed on exit."""
    tag = f"nlg{uuid.uuid4().hex[:5]}"
    net = Net(tag, {f"{tag}-{r}": a for r, a in roles.items()}, f"{tag}-sw")
    created: list[str] = []
    try:
        for name in [net.switch, *net.hosts]:
            ip("netns", "add", name)
            created.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        ip("-n", net.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", net.switch, "link", "set", "br0", "up")
        for k, (name, addr) in enumerate(net.hosts.items()):
            port = f"p{k}"
            ip("-n", net.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name)
            ip("-n", net.switch, "link", "set", port, "master", "br0", "up")
            ip("-n", name, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", name, "link", "set", "eth0", "up")
        for k, role in enumerate(roles):
            if role in impaired:
                impair(net, f"p{k}", net.ns(role))
        if net.impairment.startswith("iptables"):
            run("ip", "netns", "exec", net.switch, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
            delayer = net.popen(
                "sw",
                f"exec {shlex.quote(sys.executable)} {shlex.quote(str(NFQUEUE_HELPER))} "
                f"--delay-ms {DELAY_MS} --jitter-ms {JITTER_MS} --seed 1",
                cwd=Path.cwd(),
            )
            assert delayer.stdout is not None
            assert delayer.stdout.readline().strip() == b"ready", (
                delayer.stderr.read() if delayer.stderr else ""
            )
        yield net
    finally:
        net.stop_all()
        for name in reversed(created):
            run("ip", "netns", "del", name, check=False)
