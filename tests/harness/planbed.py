"""A deployment on loopback, exactly as ``nlagg deploy plan`` writes it, judged against the simulator.

The plan's own Mosquitto configuration (password file, graph ACL, sessions bound to users, payload
cap, TLS when asked), and the plan's own ``commands.txt`` lines for the eavesdropper, the launcher
and every node (replay mode: nodes draw z^(0) from the run seed, so the run is the simulator's
trial 0). Used by the hostile-client test, the TLS deployment test, the site tests and
``benchmarks/soak.py``; with a ``net`` (tests/harness/netns.py) every part runs in a network namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from nlagg_node.config import RunConfig
from nlagg_node.deploy import PlanSpec, build_plan, write_plan
from nlagg_node.deploy.continuous import EpochTimetable
from nlagg_node.runtime.brokers import BrokerHandle, free_port, mosquitto_binary, start_mosquitto
from nlagg_node.schedule import plan_phases
from tests.harness.turncoat import ENTRY as TURNCOAT
from tests.harness.turncoat import Forge
from tests.harness.verdict import Verdict, judge

if TYPE_CHECKING:
    from tests.harness.netns import Net

__all__ = ["PlanBed", "listening"]

ENTRY = [sys.executable, "-c", "from nlagg_node.cli import main; main()"]


class PlanBed:
    """Plan, broker, eavesdropper, launcher and nodes of one run (``cfg``'s seed) under ``workdir``.

    ``early`` runs once the eavesdropper has subscribed and before the launcher publishes the
    run's configuration (a hostile client's first messages). ``port`` is the plan's listener;
    ``client_port``, when given, the port every client dials instead (a relay in front of it).
    ``sites`` > 1: that many site brokers on free loopback ports, bridged as the plan says (the
    nodes start once every bridge is connected); the eavesdropper captures from all of them.
    ``auth=False``: a plan without identities (``--no-auth``). ``capture=False`` starts the brokers
    only (no eavesdropper, no launcher). ``tls``: the plan's own CA and TLS listeners (bridges too),
    ``require_certificate``: and a client certificate per user. ``schedule``: a continuous
    deployment (``--every``; its eavesdropper captures every epoch), ``eavesdrop_args`` added to the
    eavesdropper's commands.txt line (e.g. ``--epochs 2``).

    ``net``: each site s's broker and nodes run in ``net``'s host ``site<s>``, the eavesdropper and
    the launcher in its host ``eaves``; the brokers listen on ``port`` (default 1883) of every
    address of their namespace and are dialled at their host's address (bridges included), so only
    a site's own nodes reach its broker without crossing the namespaces' bridge.
    """

    def __init__(
        self,
        cfg: RunConfig,
        workdir: Path,
        *,
        run_id: str = "planbed",
        tls: bool = False,
        require_certificate: bool = False,
        corrupt: str | None = None,
        early: Callable[[PlanBed], Awaitable[None]] | None = None,
        port: int | None = None,
        client_port: int | None = None,
        sites: int = 1,
        capture: bool = True,
        net: Net | None = None,
        auth: bool = True,
        schedule: EpochTimetable | None = None,
        eavesdrop_args: Sequence[str] = (),
    ) -> None:
        self.cfg = cfg.resolved().model_copy(update={"trials": 1})
        self.workdir = workdir
        self.root = workdir / "plan"
        self.run_id = run_id
        self.net = net
        if net is not None:
            if tls or client_port is not None:
                raise ValueError("PlanBed over namespaces takes neither tls nor client_port")
            self.port = port or 1883
            urls = [f"mqtt://{net.address(f'site{s}')}:{self.port}" for s in range(sites)]
            self.url = urls[0]
            self.site_urls = urls if sites > 1 else []
        else:
            self.port = port or free_port()  # the plan's listener
            scheme = "mqtts" if tls else "mqtt"
            # What every client dials: the listener, or a relay in front of it (client_port).
            host = "localhost" if tls else "127.0.0.1"  # what the plan's certificates name
            self.url = f"{scheme}://{host}:{client_port or self.port}"
            ports = [self.port, *(free_port() for _ in range(sites - 1))] if sites > 1 else []
            self.site_urls = [f"{scheme}://{host}:{p}" for p in ports]
        self.spec = PlanSpec(
            run=self.cfg,
            run_id=run_id,
            seed=self.cfg.seed,
            replay=True,
            corrupt=corrupt,
            listen_host=None if net is not None else "127.0.0.1",
            listen_port=self.port,
            broker_url=self.url,
            make_tls=tls,
            require_certificate=require_certificate,
            sites=sites,
            site_brokers=tuple(self.site_urls),
            auth=auth,
            schedule=schedule,
        )
        self.eavesdrop_args = list(eavesdrop_args)
        self.early = early
        self.capture = capture
        self.plan = build_plan(self.spec)
        self.phases = plan_phases(self.cfg)
        self.t_total = sum(p.t_len for p in self.phases)
        self.db = self.root / "transcript.sqlite"
        self.logs = workdir / "logs"
        self.broker: BrokerHandle | None = None
        self.brokers: list[BrokerHandle] = []
        self._stack = contextlib.AsyncExitStack()
        self.eavesdropper: asyncio.subprocess.Process | None = None
        self.nodes: dict[int, asyncio.subprocess.Process] = {}
        self.eavesdropper_finished: dict[str, Any] = {}  # its last event, once it has ended

    def password(self, user: str) -> str:
        return (self.root / "secrets" / f"{user}.pw").read_text().strip()

    def phase_at(self, t: int) -> str:
        start = 0
        for phase in self.phases:
            if t < start + phase.t_len:
                return phase.name
            start += phase.t_len
        return self.phases[-1].name

    def _lines(self, part: str) -> list[list[str]]:
        """commands.txt's lines of ``part``: eavesdrop, deploy (the launcher's), node or mosquitto."""
        text = (self.root / "commands.txt").read_text()
        argvs = [shlex.split(ln) for ln in text.splitlines() if ln and not ln.startswith("#")]
        if part == "mosquitto":
            return [a for a in argvs if a[0] == "mosquitto"]
        return [a for a in argvs if a[:2] == ["nlagg", part]]

    def _in(self, role: str, argv: list[str]) -> list[str]:
        """``argv`` as run in host ``role`` of the bed's ``net`` (unchanged without one)."""
        return argv if self.net is None else self.net.argv(role, argv)

    async def _start(
        self, argv: list[str], log: str, role: str = "eaves", forge: Forge | None = None
    ) -> asyncio.subprocess.Process:
        """``argv`` (an ``nlagg`` line) in ``role``'s host; ``forge``: as a turncoat (its x's lie)."""
        assert argv[0] == "nlagg"
        entry = ENTRY if forge is None else [sys.executable, *TURNCOAT]
        env = None if forge is None else os.environ | forge.environment()
        with (self.logs / log).open("wb") as err:
            return await asyncio.create_subprocess_exec(
                *self._in(role, [*entry, *argv[1:]]),
                cwd=self.root,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=env,
            )

    async def __aenter__(self) -> Self:
        try:
            return await self._enter()
        except BaseException:
            await self.__aexit__(*sys.exc_info())  # stops what had started
            raise

    async def _enter(self) -> Self:
        self.logs.mkdir(parents=True, exist_ok=True)
        write_plan(self.plan, self.root)
        await self._stack.__aenter__()
        for s, mosquitto in enumerate(self._lines("mosquitto")):
            if self.net is not None:
                self.brokers.append(await self._site_broker(s, self.root / mosquitto[-1]))
                continue
            self.brokers.append(
                await self._stack.enter_async_context(
                    start_mosquitto(
                        extra_config=self.root / mosquitto[-1],
                        workdir=self.root,
                        extra_lines=["user root"] if os.geteuid() == 0 else [],
                        allow_anonymous=False,
                    )
                )
            )
        self.broker = self.brokers[0]
        await self._bridges_up()
        if not self.capture:
            return self
        (eaves,) = self._lines("eavesdrop")
        self.eavesdropper = await self._start(
            [*eaves, *self.eavesdrop_args, "--events", "--no-live", "--verbose"], "eaves.log"
        )
        assert self.eavesdropper.stdout is not None
        async with asyncio.timeout(60):
            while b'"subscribed"' not in await self.eavesdropper.stdout.readline():
                pass
        if self.early is not None:
            await self.early(self)
        for k, launcher in enumerate(self._lines("deploy")):
            proc = await self._start(launcher, f"launcher{k}.log")
            assert await proc.wait() == 0, (self.logs / f"launcher{k}.log").read_text()
        return self

    def _as_root(self, s: int, conf: Path) -> Path:
        """The plan's ``conf`` of site ``s`` plus ``user root``: Mosquitto would otherwise drop to its
        own user, which cannot enter pytest's 0700 temp dirs."""
        own = self.workdir / f"site{s}-mosquitto.conf"
        own.write_text(conf.read_text() + "user root\n")
        own.chmod(0o600)  # the bridges' passwords
        return own

    async def _site_broker(self, s: int, conf: Path, within: float = 10.0) -> BrokerHandle:
        """Site ``s``'s Mosquitto, from the plan's own configuration, in host ``site<s>`` of the net."""
        assert self.net is not None
        own = self._as_root(s, conf)
        log = self.logs / f"mosquitto-site{s}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *self._in(f"site{s}", [mosquitto_binary() or "mosquitto", "-c", str(own)]),
                cwd=self.root,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        self._stack.push_async_callback(_terminate, proc)
        async with asyncio.timeout(within):
            while not listening(proc.pid, self.port):
                assert proc.returncode is None, log.read_text(errors="replace")
                await asyncio.sleep(0.05)
        host = self.net.address(f"site{s}")
        return BrokerHandle("mosquitto", host, self.port, own, log, proc.pid)

    async def _bridges_up(self, within: float = 30.0) -> None:
        """Wait until every bridge of the plan is connected (its remote broker's log says so)."""
        async with asyncio.timeout(within):
            for bridge in self.plan.bridges:
                log = self.brokers[bridge.remote].log_path
                assert log is not None
                while True:  # polled: the log is a file Mosquitto appends to
                    if f" as {bridge.user} " in log.read_text(errors="replace"):
                        break
                    await asyncio.sleep(0.05)

    async def start_nodes(
        self,
        skip: frozenset[int] = frozenset(),
        extra: Sequence[str] = (),
        turncoat: tuple[int, Forge] | None = None,
    ) -> None:
        """Start every node's commands.txt line (with ``extra`` options) but those in ``skip`` (run
        elsewhere, e.g. on a Pi); ``turncoat``: ``(j, forge)``, node j's line run by an insider
        holding its whole bundle whose x's carry ``forge``'s fields (:mod:`tests.harness.turncoat`)."""
        for i, argv in enumerate(self._lines("node")):
            if i not in skip:
                site = f"site{self.plan.site_of[i]}"
                forge = turncoat[1] if turncoat is not None and turncoat[0] == i else None
                self.nodes[i] = await self._start([*argv, *extra, "--json"], f"node{i}.log", site, forge)

    async def relaunch(self) -> None:
        """A second start of the plan on the same brokers: the launcher's commands.txt line again
        (then :meth:`start_nodes`); the first start's nodes must have ended."""
        assert all(p.returncode is not None for p in self.nodes.values())
        self.nodes = {}
        for k, launcher in enumerate(self._lines("deploy")):
            proc = await self._start(launcher, f"relaunch{k}.log")
            assert await proc.wait() == 0, (self.logs / f"relaunch{k}.log").read_text()

    async def outcomes(self, within: float = 240.0) -> dict[int, tuple[int, dict[str, Any] | None]]:
        """Each started node's exit status and, when it exited 0, its JSON result (no eavesdropper)."""
        out: dict[int, tuple[int, dict[str, Any] | None]] = {}
        async with asyncio.timeout(within):
            for i, proc in self.nodes.items():
                stdout, _ = await proc.communicate()
                lines = stdout.decode().strip().splitlines()
                rc = proc.returncode
                assert rc is not None
                out[i] = (rc, json.loads(lines[-1]) if rc == 0 and lines else None)
        return out

    def current_t(self) -> int:
        """The latest iteration with a valid x in the transcript."""
        if not self.db.exists():
            return 0
        with contextlib.closing(sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT MAX(t) FROM messages WHERE valid = 1 AND kind = 'x'").fetchone()
        return int(row[0] or 0)

    async def wait_t(self, fraction: float, within: float = 120.0) -> None:
        """Wait until the run has reached ``fraction`` of its iterations (as the transcript shows)."""
        async with asyncio.timeout(within):
            while self.current_t() < fraction * self.t_total:
                if any(p.returncode not in (None, 0) for p in self.nodes.values()):
                    return
                await asyncio.sleep(0.05)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for proc in [*self.nodes.values(), *([self.eavesdropper] if self.eavesdropper else [])]:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await self._stack.__aexit__(exc_type, exc, tb)

    async def finish(self, within: float = 240.0) -> Verdict:
        """Wait for every node and the eavesdropper, then compare with the simulator."""
        results: dict[int, dict[str, Any]] = {}
        detail: list[str] = []
        try:
            async with asyncio.timeout(within):
                for i, proc in self.nodes.items():
                    out, _ = await proc.communicate()
                    if proc.returncode != 0:
                        detail.append(f"node {i} exited with {proc.returncode}")
                    else:
                        results[i] = json.loads(out.decode().strip().splitlines()[-1])
                await self.wait_eavesdropper(detail)
        except TimeoutError:
            detail.append(f"not finished within {within:g} s")
        return self.verdict(results, detail)

    async def wait_eavesdropper(self, detail: list[str]) -> None:
        """Wait for the eavesdropper to end; keep its ``finished`` event (what it refused)."""
        assert self.eavesdropper is not None
        out, _ = await self.eavesdropper.communicate()
        if self.eavesdropper.returncode != 0:
            detail.append(f"eavesdropper exited with {self.eavesdropper.returncode}")
        events = [json.loads(line) for line in out.decode().splitlines() if line.startswith('{"event"')]
        self.eavesdropper_finished = next((e for e in reversed(events) if e["event"] == "finished"), {})

    def verdict(self, results: dict[int, dict[str, Any]], detail: list[str]) -> Verdict:
        """Against the simulator's trial 0, with the attack on the transcript scored (``precision``)."""
        return judge(
            self.cfg,
            self.db,
            results,
            detail,
            eavesdropper=self.eavesdropper_finished,
            corrupt=self.plan.corrupted,
            truth=self.workdir / "truth.json",
        )

    def report(self) -> dict[str, Any]:
        """Log tails, for an assertion message."""
        return {p.name: p.read_text()[-1500:] for p in sorted(self.logs.glob("*.log"))}


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            async with asyncio.timeout(5):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


def listening(pid: int, port: int) -> bool:
    """Whether TCP ``port`` listens (IPv4) in the network namespace of process ``pid``: its
    /proc/<pid>/net/tcp shows that namespace's sockets, seen from here without entering it."""
    try:
        rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(f[1].endswith(f":{port:04X}") and f[3] == "0A" for f in map(str.split, rows))
