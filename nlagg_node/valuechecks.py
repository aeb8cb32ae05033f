"""The checks of a run's values and start that refuse to leak.

A run may declare ``value_range = [lo, hi]`` (public, like the rest of the config); every runtime
maps a private value to the protocol's scale with it (:mod:`nlagg_node.valuemap`). The checks here
are pure functions of the public config and one value, called by the simulator, the node's entry
points (``nlagg node``, the testbed) and the adversary alike:

* :func:`check_values` refuses a value outside the declared range;
* :func:`check_start` refuses a one-sided initialization whose start does not lie on the
  protected side of the value (of the whole range, when one is declared);
* :func:`leak_warning` names operator/init pairs that expose every value under the run's
  threat model (:mod:`nlagg_node.threat`: which z^(0) the eavesdropper knows).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .config import RunConfig
from .errors import ConfigError
from .valuemap import scale_for

__all__ = [
    "check_node_value",
    "check_start",
    "check_values",
    "config_warnings",
    "leak_warning",
    "start_problem",
]


def _fmt(v: float) -> str:
    return f"{v:g}"


def range_text(cfg: RunConfig) -> str:
    if cfg.value_range is None:
        return "value_range unset"
    lo, hi = cfg.value_range
    return f"value_range [{_fmt(lo)}, {_fmt(hi)}]"


def check_values(cfg: RunConfig, values: Any, field: str = "value") -> None:
    """Refuse any value outside the declared range (exit code 2 at the command line).

    Raises
    ------
    ConfigError
        Naming the first offending value and the range.
    """
    if cfg.value_range is None:
        return
    lo, hi = cfg.value_range
    arr = np.asarray(values, dtype=np.float64).ravel()
    bad = np.flatnonzero((arr < lo) | (arr > hi) | ~np.isfinite(arr))
    if len(bad):
        v = float(arr[bad[0]])
        raise ConfigError(field, v, f"outside {range_text(cfg)}; fix the sensor or declare a wider range")


def one_sided_starts(cfg: RunConfig) -> list[tuple[str, float]]:
    """``(direction, start)`` of every one-sided initialization of the run, in protocol units.

    ``from-above`` starts x near ``center + mu_z / c`` (the lower linear branch is at most ``1 / c``
    below it), ``from-below`` near ``center - mu_z / c``; ``center`` is 0 without a range and the
    range's midpoint (1/2 in protocol units) with one. Only values on the far side of the start
    are protected at t = 0: below it from above, above it from below.
    """
    from .schedule import phase_c, plan_phases

    cfg = cfg.resolved()
    out: list[tuple[str, float]] = []
    seen: set[str] = set()
    for ph in plan_phases(cfg):
        kind = ph.init.kind
        if kind not in ("from-above", "from-below") or ph.group in seen:
            continue
        seen.add(ph.group)
        c = phase_c(cfg, ph)
        if kind == "from-above":
            out.append((kind, ph.init.center + (ph.init.mu_z - 1.0) / c))
        else:
            out.append((kind, ph.init.center - (ph.init.mu_z - 1.0) / c))
    return out


def start_problem(cfg: RunConfig, value: float | None = None) -> str | None:
    """Why the initialization would publish a raw value before the protocol protects it, or None.

    With a declared range the start must lie beyond the whole range (every node's value is
    protected); without one, beyond ``value`` (this node's raw value) when it is given.
    """
    cfg = cfg.resolved()
    scale = scale_for(cfg)
    if cfg.value_range is not None:
        top, bottom = 1.0, 0.0
        what = range_text(cfg)
    elif value is not None:
        top = bottom = float(value)
        what = f"{range_text(cfg)} and the value {_fmt(float(value))}"
    else:
        return None
    for kind, start in one_sided_starts(cfg):
        bad = start <= top if kind == "from-above" else start >= bottom
        if bad:
            side = "above" if kind == "from-above" else "below"
            at = _fmt(scale.user_float(start))
            return (
                f"the {kind} initialization starts x at about {at} in the value's units"
                f" (mu_z={_fmt(cfg.mu_z_value)}, c={_fmt(cfg.c_value)}), not {side} {what}:"
                + (" raise mu_z" if cfg.value_range is not None else " declare value_range or raise mu_z")
            )
    return None


def check_start(cfg: RunConfig, value: float | None = None) -> None:
    """Refuse a configuration whose start is not on the protected side (see :func:`start_problem`).

    Raises
    ------
    ConfigError
        Naming mu_z, c and the range.
    """
    why = start_problem(cfg, value)
    if why is not None:
        raise ConfigError("mu_z", cfg.mu_z_value, why)


def check_node_value(cfg: RunConfig, value: float) -> float:
    """Everything a node checks before it publishes anything; returns the value in protocol units."""
    check_values(cfg, value)
    check_start(cfg, value)
    return scale_for(cfg).protocol_float(value)


def leak_warning(cfg: RunConfig) -> str | None:
    """One line when the operator/init pair exposes every value under the current threat model.

    * Average consensus (``average``, the trimmed mean's average part): while the eavesdropper
      knows its z^(0) (plaintext, ``--init-channel plain``, or sealed but not random), it solves
      ``s_i = x_i (1 + c d_i) + v_i`` for every node at the first average iteration.
    * A zero (``none``) start of a piecewise operator whose first x-update returns s_i for every
      value of the domain (the declared range, else the real line).
    """
    from .schedule import phase_c, plan_phases, secret_groups_of

    cfg = cfg.resolved()
    phases = plan_phases(cfg)
    secret = secret_groups_of(cfg, phases)
    if any(ph.objective.kind == "quadratic" and ph.group not in secret for ph in phases):
        why = (
            "is public (--init-channel plain, protocol v1)"
            if cfg.init_channel == "plain"
            else "is not random, so the public config fixes it"
        )
        return (
            f"warning: --op {cfg.op} --init {cfg.init} exposes every value: the average part's z^(0)"
            f" {why}, so s_i = x_i (1 + c d_i) + v_i at its first iteration"
        )
    first = phases[0]
    if first.init.kind != "zero" or cfg.init != "none":
        return None
    lo_dom, hi_dom = (0.0, 1.0) if cfg.value_range is not None else (-np.inf, np.inf)
    c = phase_c(cfg, first)
    # x^(0) = clip(s, -alpha / (c d), beta / (c d)); d >= 1, so the narrowest interval is d = n - 1.
    d = max(1, cfg.n - 1)
    lo, hi = -first.objective.alpha / (c * d), first.objective.beta / (c * d)
    if lo <= lo_dom and hi >= hi_dom:
        return (
            f"warning: --op {cfg.op} --init none exposes every value at t = 0 (x_i^(0) = s_i for every"
            f" value in {range_text(cfg)})"
        )
    return None


def config_warnings(cfg: RunConfig) -> list[str]:
    """One-line warnings for a run that exposes values by construction (printed on stderr)."""
    out = [w for w in (leak_warning(cfg),) if w is not None]
    why = start_problem(cfg)
    if why is not None:
        out.append(f"warning: {why} (a node refuses this configuration)")
    return out
