#!/usr/bin/env bash
# Acceptance-size I/O benchmark (docs/io.md): 40 members x 100 MB, NetCDF-4, then CDF-5.
# References: pread/pwrite with one thread and with enkflow's thread count; the pwrite references
# write the file's byte order, so the files hold their values throughout (files_unchanged).
# Needs ~4 GB free disk per format beside the current directory and ~12 GB RAM (X + page cache).
# Usage: benchmarks/bench_io.sh [extra enkflow bench io options]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$here/.venv/bin/python}"
for fmt in nc4 cdf5; do
  "$py" -m enkflow bench io --members 40 --mb-per-file 100 --format "$fmt" --json "$@"
done
