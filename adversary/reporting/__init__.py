"""What a person looks at: the figures (:mod:`~adversary.reporting.plots`, matplotlib set up by
:mod:`~adversary.reporting.figure`) and the live dashboard (:mod:`~adversary.reporting.dashboard`).
"""
