#!/usr/bin/env bash
# Set-up of enkflow: everything the package, its native parts (native/) and the test suite need.
#
#   ./setup.sh          then   . .venv/bin/activate && python -m pytest -q
#
# 1. System packages. On Debian (or a derivative), the packages in DEBIAN_PACKAGES that are not installed
#    and that its apt knows are installed with apt-get when this runs as root (Ubuntu ships Chromium only as
#    a snap: without /usr/bin/chromium the report's browser test skips, saying so); otherwise it prints the exact apt-get line to run
#    (and on other systems what to install), finishes the Python part, and exits with status 3.
# 2. Python: `pip install -e .[dev]` into the active virtual environment, or into ./.venv (created with
#    python3 -m venv when missing). `.ci/run` runs this same script, so CI and a newcomer's set-up agree.
#
# SLURM is not installed here: the SLURM tests install and start a local one themselves when run as root
# (testing/enkflow_testing/localslurm.py), and skip otherwise.
set -euo pipefail
cd "$(dirname "$0")"

# Python >= 3.11 with venv and headers (the compiled kernel); C and Fortran compilers, make, CMake,
# pkg-config, ZeroMQ, libsodium and netCDF (C and Fortran) for native/; strace for the syscall fault tests;
# Chromium and chromedriver for the report's browser test; iproute2 and procps for the namespace tests; git.
DEBIAN_PACKAGES=(python3 python3-venv python3-dev gcc g++ gfortran make cmake pkg-config libzmq3-dev
                 libsodium-dev libnetcdf-dev libnetcdff-dev strace chromium chromium-driver iproute2 procps
                 git ca-certificates)
OTHER_SYSTEMS="Python >= 3.11 with venv and its headers, gcc and gfortran, make, CMake, pkg-config, the \
development files of ZeroMQ (libzmq), libsodium, netCDF-C and netCDF-Fortran, strace, Chromium and chromedriver \
(/usr/bin/chromium, /usr/bin/chromedriver), iproute2, git"

missing_debian() {
  local p
  for p in "${DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q "install ok installed" || printf '%s ' "$p"
  done
}

system_packages() {
  # Prints what is still to install (nothing when all is there).
  if ! command -v dpkg-query >/dev/null; then
    local need=""
    for c in python3 gcc gfortran make cmake pkg-config strace chromium chromedriver ip git; do
      command -v "$c" >/dev/null || need+="$c "
    done
    pkg-config --exists libzmq libsodium netcdf netcdf-fortran 2>/dev/null \
      || need+="(libzmq/libsodium/netCDF development files) "
    [ -z "$need" ] || echo "not a Debian system, and missing: $need- install: $OTHER_SYSTEMS"
    return 0
  fi
  local missing
  missing=$(missing_debian)
  [ -n "$missing" ] || return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup.sh: installing Debian packages: $missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || echo "setup.sh: apt-get update failed; trying the package lists at hand" >&2
    # Only the packages this distribution has: one unknown name (Ubuntu has no 'chromium' deb, only a snap)
    # would make apt-get install none of them.
    local known="" p
    for p in $missing; do
      if apt-cache show "$p" >/dev/null 2>&1; then known+="$p "; fi
    done
    # shellcheck disable=SC2086  # one word per package
    [ -z "$known" ] || apt-get install -y -qq --no-install-recommends $known >/dev/null \
      || echo "setup.sh: apt-get install failed (its message is above)" >&2
    missing=$(missing_debian)
  fi
  [ -z "$missing" ] || echo "missing Debian packages; as root run: apt-get install -y --no-install-recommends $missing"
}

todo=$(system_packages)

if [ -n "${VIRTUAL_ENV:-}" ]; then
  py=python
else
  # A venv made without python3-venv's ensurepip has a python but no pip: make it again.
  if [ ! -x .venv/bin/python ] || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    rm -rf .venv
    command -v python3 >/dev/null || { echo "setup.sh: no python3. $todo" >&2; exit 3; }
    python3 -m venv .venv || { rm -rf .venv; echo "setup.sh: python3 -m venv failed. $todo" >&2; exit 3; }
  fi
  py=.venv/bin/python
fi
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "setup.sh: enkflow needs Python >= 3.11, $("$py" --version) found" >&2; exit 3; }
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet -e '.[dev]'
"$py" -m enkflow --version

if [ -n "$todo" ]; then
  echo "setup.sh: the Python package is installed, but the native parts and some tests need more: $todo" >&2
  exit 3
fi
activate=$([ -n "${VIRTUAL_ENV:-}" ] || echo ". .venv/bin/activate && ")
echo "setup.sh: done; run the tests with: ${activate}python -m pytest -q" >&2
