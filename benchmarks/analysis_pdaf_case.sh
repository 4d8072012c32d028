#!/usr/bin/env bash
# The PDAF comparison case of the analysis (docs/analysis.md): 1000 x 1000 Cartesian grid, 40 members,
# H = identity at 10% of the points (obs std 0.25), GC weights reaching 0 at 10 grid units, one local
# analysis per point; 1 and 2 MPI ranks, the NumPy/SciPy baseline from the same run (one batched
# KD-tree search, per-point LAPACK): whole-analysis and kernel-only ratios, per core.
# PDAF 3.0 (gfortran -O3, OpenBLAS) needs about 0.2 ms per point single process on this machine class.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$here/.venv/bin/python}"
"$py" -m enkflow bench analysis --nx 1000 --ny 1000 --members 40 --obs-fraction 0.1 --obs-std 0.25 \
  --cutoff 10 --ranks 1,2 --json "$@"
