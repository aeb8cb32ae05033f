"""The adversary's live dashboard: a read-only web page of what the eavesdropper learns.

``nlagg dashboard transcript.sqlite`` serves one transcript (a growing one live, a finished one
for replay); ``nlagg eavesdrop --dashboard :PORT`` and ``nlagg testbed --dashboard :PORT`` serve
the transcript they are writing. :class:`~adversary.reporting.dashboard.state.DashboardState` reads the
transcript incrementally and runs the eavesdropper's own replay (:mod:`adversary.live`) and attack
(:mod:`adversary.attack`); :mod:`adversary.reporting.dashboard.server` is the Starlette app and its access
rules; ``static/`` holds the page (plain HTML, CSS, JavaScript and SVG: nothing to build, nothing
from a CDN).
"""

from __future__ import annotations

from .epochs import EpochDashboardState
from .gate import GateLimits
from .server import Dashboard, is_loopback, parse_listen, serve_beside, serve_dashboard
from .state import DashboardState

__all__ = [
    "Dashboard",
    "DashboardState",
    "EpochDashboardState",
    "GateLimits",
    "is_loopback",
    "parse_listen",
    "serve_beside",
    "serve_dashboard",
]
