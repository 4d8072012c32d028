"""Test and benchmark harnesses of enkflow: never installed with the package.

Imported by ``tests/`` (pytest's ``pythonpath`` setting) and by ``benchmarks/``
(which put this folder on ``sys.path``): a local SLURM bootstrap, fault injectors.
"""
