"""Leakage measurement: the KSG mutual-information estimator (:mod:`~adversary.analysis.mi`, its
compiled kernels in :mod:`~adversary.analysis.ksg_kernels`) and the paper's experiments
(:mod:`~adversary.analysis.experiments`, made of the panels of :mod:`~adversary.analysis.panels`).
The public names are re-exported by :mod:`adversary`.
"""
