"""The dashboard's web server: a read-only Starlette app on uvicorn, fed by :class:`DashboardState`
(or, for an epoch store, :class:`~adversary.reporting.dashboard.epochs.EpochDashboardState`).

Routes (GET only; anything else is 405): ``/`` the page, ``/static/...`` its vendored assets,
``/api/state`` the whole state as JSON, ``/api/events`` the same state as Server-Sent Events (one
``snapshot``, then a ``delta`` with only what is new whenever the transcript grows), and
``/api/at?t=K`` every node's state as of iteration K (the time slider).

Access: on a loopback address nobody else can reach the port, so no login is asked; the Host
header must then name a loopback host too (a web page elsewhere cannot reach it by DNS
rebinding). On any other address every request needs the token printed at start, as
``?token=`` (the page then keeps it in an HttpOnly cookie), the cookie, or ``Authorization:
Bearer``. The page's Content-Security-Policy allows only its own origin: nothing is fetched from
a CDN, and nothing on the page can reach elsewhere. A refused request's connection is closed
after the answer, and connections without a request under way are bounded per source, in all
and in time (:mod:`.gate`), so an outsider's idle sockets cannot exhaust the descriptors; complete
``/api/events`` streams are capped at :data:`MAX_EVENT_STREAMS` at once (more: 503 with
``Retry-After``), as 1100 of them exhausted a loopback dashboard's descriptors (issue 43).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nlagg_node.errors import ConfigError
from nlagg_node.lifetime import stop_requested

from ...transcript.reader import settle_file
from .epochs import DashboardView, open_state
from .gate import ConnectionGate, GateLimits, gated_app, gated_protocol

__all__ = [
    "MAX_EVENT_STREAMS",
    "Dashboard",
    "build_app",
    "is_loopback",
    "parse_listen",
    "serve_beside",
    "serve_dashboard",
]

T = TypeVar("T")

log = logging.getLogger("nlagg.dashboard")
STATIC = Path(__file__).parent / "static"
COOKIE = "nlagg_dashboard_token"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
KEEPALIVE_S = 15.0
# Event streams served at once: each holds a socket and a task for as long as its page is open, so
# an outsider's 1100 complete requests exhausted the descriptors; past the cap, a 503.
MAX_EVENT_STREAMS = 64
BACKLOG = 128  # also what one turn of the event loop accepts at most, before the gate closes any


def parse_listen(spec: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``:8080``, ``8080``, ``HOST:8080`` or ``[::1]:8080`` -> (host, port); port 0 picks a free one."""
    text = spec.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]") or default_host
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError("dashboard", spec, "use :PORT or HOST:PORT (for example :8080)") from None
    if not 0 <= port <= 65535:
        raise ConfigError("dashboard", spec, "the port must lie in 0..65535")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(header: str) -> str:
    """The host part of a Host header (``[::1]:8080`` -> ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class _Guard:
    """GET/HEAD only, the token (or a loopback Host), and the security headers on every response."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        set_cookie = self.token is not None and "token" in request.query_params

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Content-Security-Policy"] = CSP
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Referrer-Policy"] = "no-referrer"
                headers["Cache-Control"] = "no-store"
                if set_cookie:
                    headers.append("Set-Cookie", f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/")
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refusal(self, request: Request) -> Response | None:
        if request.method not in ("GET", "HEAD"):
            return _refuse("read-only: GET only", 405, {"Allow": "GET, HEAD"})
        if self.token is None:
            if not is_loopback(_host_of(request.headers.get("host", ""))):
                return _refuse("loopback dashboard: use http://127.0.0.1:PORT/", 403)
            return None
        auth = request.headers.get("authorization", "")
        given = (
            request.query_params.get("token")
            or request.cookies.get(COOKIE)
            or (auth[7:] if auth.lower().startswith("bearer ") else "")
        )
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            return _refuse("token required: open the URL printed at start", 401)
        return None


def _refuse(text: str, status: int, headers: dict[str, str] | None = None) -> Response:
    """A refusal, closing its connection: an outsider keeps no socket open by being refused."""
    return PlainTextResponse(text, status_code=status, headers={**(headers or {}), "Connection": "close"})


class _Hub:
    """Polls the transcript and wakes the event streams when it changed."""

    def __init__(self, state: DashboardView, every: float) -> None:
        self.state = state
        self.every = every
        self.changed = asyncio.Condition()
        self.closed = False
        self._verdicts: threading.Thread | None = None

    async def run(self) -> None:
        notified = -1
        while not self.closed:
            await asyncio.to_thread(self.state.poll)
            if self.state.verdicts_due and self._verdicts is None:
                # A Monte Carlo of seconds to minutes: a daemon thread, so that stopping the
                # dashboard never waits for it.
                self._verdicts = threading.Thread(target=self.state.compute_verdicts, daemon=True)
                self._verdicts.start()
            if self.state.version != notified:
                notified = self.state.version
                async with self.changed:
                    self.changed.notify_all()
            if not self.state.more:
                await asyncio.sleep(self.every if not self.state.finished else max(1.0, self.every))

    async def wait_newer(self, version: int, within: float) -> bool:
        """Wait until the state's version exceeds ``version`` (False on timeout or close)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within), self.changed:
                await self.changed.wait_for(lambda: self.closed or self.state.version > version)
        return not self.closed and self.state.version > version

    async def close(self) -> None:
        self.closed = True
        async with self.changed:
            self.changed.notify_all()


class _EventStream(StreamingResponse):
    """An ``/api/events`` stream that gives its slot back however it ends (finished, the client gone,
    cancelled before its first byte)."""

    def __init__(self, parts: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(parts, media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


def _sse(event: str, doc: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(doc, separators=(',', ':'), allow_nan=False)}\n\n"


def build_app(
    state: DashboardView, hub: _Hub, token: str | None, max_streams: int = MAX_EVENT_STREAMS
) -> ASGIApp:
    """The Starlette application (read-only routes), wrapped in the access guard; at most
    ``max_streams`` ``/api/events`` streams at once (more: 503 with ``Retry-After``)."""
    streams = 0

    async def index(_request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def full_state(_request: Request) -> Response:
        return JSONResponse(await asyncio.to_thread(state.snapshot))

    async def at(request: Request) -> Response:
        try:
            t = int(request.query_params.get("t", ""))
        except ValueError:
            return PlainTextResponse("t: give an iteration number", status_code=400)
        return JSONResponse(await asyncio.to_thread(state.nodes_at, t))

    async def events(request: Request) -> Response:
        nonlocal streams
        if streams >= max_streams:
            why = f"{max_streams} event streams are open, the most this dashboard serves; retry later"
            return _refuse(why, 503, {"Retry-After": str(int(KEEPALIVE_S))})
        streams += 1

        def release() -> None:
            nonlocal streams
            streams -= 1

        async def updates() -> AsyncIterator[str]:
            doc = await asyncio.to_thread(state.snapshot)
            yield _sse("snapshot", doc)
            have_graph, epoch = "config" in doc, doc.get("epoch")
            while not hub.closed:
                cols = int(doc.get("columns_from", 0)) + len(doc.get("columns", []))
                exps = int(doc.get("exposures_from", 0)) + len(doc.get("exposures", []))
                if not await hub.wait_newer(int(doc["version"]), KEEPALIVE_S):
                    if await request.is_disconnected():
                        return
                    yield ": keep-alive\n\n"
                    continue
                if have_graph:
                    doc = await asyncio.to_thread(state.snapshot, cols, exps, graph=False)
                    if doc.get("epoch") == epoch:
                        yield _sse("delta", doc)
                        continue
                # The config was not in yet, or an epoch store moved on to a new epoch: everything.
                doc = await asyncio.to_thread(state.snapshot)
                yield _sse("snapshot", doc)
                have_graph, epoch = "config" in doc, doc.get("epoch")

        return _EventStream(updates(), release)

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/api/state", full_state),
            Route("/api/at", at),
            Route("/api/events", events),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
    return _Guard(app, token)


class _Server(uvicorn.Server):
    """uvicorn inside someone else's event loop: the embedding command owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError("host", host, f"cannot listen there ({exc.strerror or exc})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError("port", port, f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    sock.setblocking(False)
    return sock


class Dashboard:
    """The dashboard of one transcript, served while the context is open.

    Parameters
    ----------
    transcript : the transcript file (it may still be growing, or not exist yet: see ``wait``), or an
        epoch store's folder (:class:`~adversary.reporting.dashboard.epochs.EpochDashboardState`).
    host, port : where to listen (port 0: a free one, see :attr:`port`); bound at once, so a port
        in use is reported before anything else starts.
    truth : ground truth for the leakage-vs-bound table (see :class:`DashboardState`).
    token : the access token on a non-loopback host (a fresh one when None).
    poll_every : seconds between reads of the transcript.
    wait : seconds to wait on entry for the transcript to appear (a capture starting beside it).
    limits : bounds on connections without a request under way (:class:`GateLimits`).
    """

    def __init__(
        self,
        transcript: str | Path,
        host: str = "127.0.0.1",
        port: int = 8080,
        *,
        truth: dict[str, Any] | None = None,
        token: str | None = None,
        poll_every: float = 0.25,
        wait: float = 0.0,
        limits: GateLimits | None = None,
    ) -> None:
        self.transcript = Path(transcript)
        self.host = host
        self.token = None if is_loopback(host) else (token or secrets.token_urlsafe(24))
        self.truth = truth
        self.poll_every = poll_every
        self.wait_s = wait
        self.gate = ConnectionGate(limits or GateLimits())
        self.sock = _bind(host, port)
        self.port = int(self.sock.getsockname()[1])
        self._state: DashboardView | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def state(self) -> DashboardView:
        if self._state is None:
            raise RuntimeError("the dashboard is not open")
        return self._state

    @property
    def url(self) -> str:
        """The page's address (with the token when one is needed)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    async def _open(self, abort_if: asyncio.Future[Any] | None) -> DashboardView:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while True:
            try:
                return open_state(self.transcript, truth=self.truth)
            except ConfigError:
                if loop.time() >= deadline or (abort_if is not None and abort_if.done()):
                    raise
                await asyncio.sleep(0.1)

    async def open(self, abort_if: asyncio.Future[Any] | None = None) -> Self:
        """Open the transcript (waiting up to ``wait`` s, or until ``abort_if`` is done) and serve."""
        try:
            self._state = await self._open(abort_if)
        except BaseException:
            self.sock.close()
            raise
        self.hub = _Hub(self._state, self.poll_every)
        config = uvicorn.Config(
            gated_app(build_app(self._state, self.hub, self.token), self.gate),
            http=gated_protocol(self.gate),
            backlog=BACKLOG,
            proxy_headers=False,  # the gate counts the real peer, never a forwarded-for address
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self.server = _Server(config)
        self._tasks = [
            asyncio.create_task(self.hub.run(), name="dashboard-poll"),
            asyncio.create_task(self.server.serve(sockets=[self.sock]), name="dashboard-http"),
        ]
        return self

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._state is None:
            return
        await self.hub.close()
        self.server.should_exit = True
        try:
            async with asyncio.timeout(5.0):
                await asyncio.gather(*self._tasks, return_exceptions=True)
        except TimeoutError:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.sock.close()
        self._state.close()
        self._state = None

    async def serve_until_signal(self) -> None:
        """Serve until SIGINT or SIGTERM (or until the server fails, which is raised)."""
        import signal

        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        waiter = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({waiter, *self._tasks}, return_when=asyncio.FIRST_COMPLETED)
            for task in self._tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


async def serve_dashboard(
    transcript: Path, host: str, port: int, say: Callable[[str], None] = print, *, token: str | None = None
) -> None:
    """``nlagg dashboard``: serve one transcript until SIGINT/SIGTERM."""
    async with Dashboard(transcript, host, port, token=token) as dash:
        say(f"dashboard of {transcript} (run {dash.state.run_id}) at {dash.url}  (Ctrl-C stops it)")
        await dash.serve_until_signal()


async def serve_beside(
    transcript: Path,
    listen: str,
    work: Coroutine[Any, Any, T],
    say: Callable[[str], None],
    *,
    truth: Callable[[T], dict[str, Any] | None] | None = None,
    wait: float = 120.0,
) -> T:
    """Run ``work`` (a capture or a testbed writing ``transcript``) with its dashboard beside it.

    The port is bound before ``work`` starts; the page opens as soon as the transcript exists.
    Once ``work`` is over (its result is returned), the dashboard keeps serving the finished run,
    with ``truth(result)`` as ground truth, until SIGINT or SIGTERM.
    """
    try:
        host, port = parse_listen(listen)
        dash = Dashboard(transcript, host, port, wait=wait)
    except BaseException:
        work.close()  # never started (the port is taken): no "coroutine was never awaited"
        raise
    job: asyncio.Task[T] = asyncio.ensure_future(work)
    try:
        try:
            await dash.open(abort_if=job)
        except ConfigError:
            if job.done():
                return job.result()  # the run failed (or ended) before writing a transcript: its error
            raise
        say(f"dashboard at {dash.url}")
        result = await job
        doc = truth(result) if truth is not None else None
        if doc is not None:
            dash.state.set_truth(doc)
        if stop_requested():  # the run was interrupted (Ctrl-C): the command ends now
            return result
        say(f"the run is over; the dashboard still serves it at {dash.url} (Ctrl-C stops it)")
        await dash.serve_until_signal()
        return result
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
        await dash.close()
        dash.sock.close()
        settle_file(transcript)  # the dashboard read last: the writer could not fold the WAL in
