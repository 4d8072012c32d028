"""The observation operators, one per module (:class:`enkflow.obs.locating.ObsOperator`), registered
by name in :mod:`enkflow.obs.registry`."""
