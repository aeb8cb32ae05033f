"""Initializations: the random edge duals z^(0) that carry the privacy, and the DP baselines.

Every draw goes through a generator from :func:`nlagg_node.rng.rng_for`; a node
draws its own z_{i|j}^(0) for its neighbours j in ascending order with
:func:`draw_z0`, and the simulator calls the same function per (trial, node).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .arrays import FloatArray

DualInit = Literal["zero", "from-above", "from-below", "symmetric", "prior"]


@dataclass(frozen=True)
class DualInitSpec:
    """Distribution of z_{i|j}^(0) for one set of edge duals.

    * ``zero``: z^(0) = 0, the non-private counterpart.
    * ``from-above``: z_{i|j}^(0) ~ N(-a_ij mu_z, sigma_z^2). Then
      ``v_i ~ -d_i mu_z`` and x starts near ``mu_z / c``, far above every value, and
      descends (the proposed init for max, Sec. IV-A).
    * ``from-below``: the mirror N(+a_ij mu_z, sigma_z^2), x starts near ``-mu_z / c``.
    * ``symmetric``: N(0, sigma_z^2) (median without prior; average consensus with a
      large sigma_z is the subspace perturbation of [Jane2020TIFS]).
    * ``prior``: N(-a_ij c m, sigma_z^2) so that x starts near a prior median ``m``.

    ``center`` shifts the one-sided starts to ``center +- mu_z / c``: 0 for raw values, the
    midpoint 1/2 of a declared value range on the protocol's [0, 1] scale (:mod:`nlagg_node.valuechecks`),
    so one mu_z serves max and min alike.
    """

    kind: DualInit = "zero"
    mu_z: float = 0.0
    sigma_z: float = 0.0
    c: float = 1.0
    prior_median: float = 0.0
    center: float = 0.0

    def mean_per_sign(self) -> float:
        """Mean of ``a_ij z_{i|j}^(0)``, i.e. of the signed dual u^(0)."""
        if self.kind == "from-above":
            return -(self.mu_z + self.c * self.center)
        if self.kind == "from-below":
            return self.mu_z - self.c * self.center
        if self.kind == "prior":
            return -self.c * self.prior_median
        return 0.0


def draw_z0(spec: DualInitSpec, signs: FloatArray, rng: np.random.Generator) -> FloatArray:
    """Draw ``z_{i|j}^(0)`` for one node's neighbours.

    Parameters
    ----------
    spec
        The distribution.
    signs
        ``a_ij`` for the node's neighbours j, in ascending neighbour order.
    rng
        The node's own generator (``rng_for(seed, "z0", trial, node)`` or OS entropy).
    """
    d = len(signs)
    if spec.kind == "zero":
        return np.zeros(d)
    noise = rng.standard_normal(d) * spec.sigma_z
    return signs * spec.mean_per_sign() + noise


ValueNoise = Literal["none", "gauss", "laplace"]


def perturb_value(s: float, noise: ValueNoise, sigma_s: float, rng: np.random.Generator) -> float:
    """The DP baseline: s_i once replaced by ``s_i + N(0, sigma_s^2)`` (eq. (dp_init)), or Laplace noise.

    The Laplace noise has the same standard deviation sigma_s (scale sigma_s / sqrt 2).
    """
    if noise == "none" or sigma_s == 0.0:
        return float(s)
    if noise == "gauss":
        return float(s + rng.normal(0.0, sigma_s))
    return float(s + rng.laplace(0.0, sigma_s / math.sqrt(2.0)))
