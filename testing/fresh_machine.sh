#!/usr/bin/env bash
# The README's two set-up commands on a fresh machine, as a newcomer runs them.
#
#   sudo testing/fresh_machine.sh [PYTEST ARGS...]      e.g.  tests/native tests/test_cli.py
#   sudo FRESH_CI=1 testing/fresh_machine.sh             CI's .ci/run (the same ./setup.sh, the whole suite;
#                                                        PYTEST_ADDOPTS passed through)
#
# Bootstraps a minimal Debian bookworm (debootstrap --variant=minbase: what a clean `debian:bookworm`
# container holds, no Python, no compiler) into a new folder, clones this repository's committed HEAD into
# it, and runs in it (its own root, as in a container) exactly the README's commands: `./setup.sh`, then the test command (with the
# given pytest arguments; none: the whole suite). Exit status: the test command's.
#
# Needs root and debootstrap (apt-get install debootstrap). Everything runs in a private mount namespace,
# so proc, sys, dev and the rest are unmounted on every exit, also when killed; the folder is removed at
# the end unless FRESH_KEEP=1. The bootstrapped base is cached as a tarball (FRESH_CACHE) so that a rerun
# does not download it again; delete the tarball to bootstrap anew. Downloads come from Debian's mirror
# (FRESH_MIRROR) and PyPI only.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mirror=${FRESH_MIRROR:-http://deb.debian.org/debian}
cache=${FRESH_CACHE:-/var/tmp/enkflow-fresh-bookworm-minbase.tar}
root=${FRESH_ROOT:-/var/tmp/enkflow-fresh-$$}

if [ "$(id -u)" != 0 ]; then
  echo "fresh_machine.sh: needs root (debootstrap, mounts, pivot_root)" >&2; exit 2
fi
if [ -z "${FRESH_IN_NAMESPACE:-}" ]; then
  # Re-enter in a private mount namespace: its mounts vanish with it, whatever ends the run.
  exec env FRESH_IN_NAMESPACE=1 unshare --mount --propagation private -- "$0" "$@"
fi
command -v debootstrap >/dev/null || { echo "fresh_machine.sh: apt-get install debootstrap" >&2; exit 2; }

cleanup() {
  # Everything mounted under the root (the tests' network namespaces too), then the root's own bind.
  umount -R -l "$root" 2>/dev/null
  if [ "${FRESH_KEEP:-0}" != 1 ]; then rm -rf --one-file-system "$root"; else echo "kept $root"; fi
}
trap cleanup EXIT
mkdir -p "$root"

t0=$(date +%s)
if [ -f "$cache" ]; then
  tar -C "$root" -xf "$cache"
  echo "fresh machine: base unpacked from $cache in $(( $(date +%s) - t0 )) s"
else
  nice -n 10 debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 \
    || { tail -20 "$root.debootstrap.log" >&2; exit 1; }
  rm -f "$root.debootstrap.log"
  echo "fresh machine: debootstrap of bookworm (minbase) took $(( $(date +%s) - t0 )) s"
  nice -n 10 tar -C "$root" -cf "$cache.part" . && mv "$cache.part" "$cache"
fi

# The root a bind mount of itself, as a container's root is a mount point: tests that make namespaces
# change the propagation of / (mount --make-rslave /), which fails on a plain folder.
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"  # with /sys/fs/cgroup, which slurmd needs
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
mount -t tmpfs -o mode=1777 tmp "$root/tmp"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# What a container runtime writes: debootstrap leaves no /etc/hosts, and without it neither 'localhost'
# (chromedriver's address) nor the machine's own name (SLURM's controller) resolves.
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n' "$(hostname)" >"$root/etc/hosts"
hostname >"$root/etc/hostname"
# The site's network, not the machine's set-up: where a proxy intercepts TLS, pip needs the site's CA
# bundle (FRESH_CA, default the host's PIP_CERT); it is handed to pip and nothing else is copied.
ca=${FRESH_CA:-${PIP_CERT:-}}
site_env=()
if [ -n "$ca" ] && [ -f "$ca" ]; then
  cp "$ca" "$root/etc/site-ca.crt"
  site_env=(PIP_CERT=/etc/site-ca.crt)
fi
printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\n' "$mirror" \
  >"$root/etc/apt/sources.list.d/debian.sources"
rm -f "$root/etc/apt/sources.list"
# The newcomer's copy: the committed HEAD, as a clone would give it.
git clone -q "$here" "$root/root/enkflow"

# Runs "ENV=... COMMAND..." in the fresh machine with a clean environment. Its root is the root of its own
# mount namespace (pivot_root, as a container's), not a chroot: a process that enters the mount namespace
# of another (the emulated nodes' nsenter) then lands in the fresh machine, not on the host.
in_machine() {
  unshare --mount --propagation private -- /bin/sh -c 'cd "$1" && mkdir -p .host && pivot_root . .host && cd / \
    && umount -l /.host && rmdir /.host && shift && exec "$@"' in_machine "$root" \
    /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
    TERM=dumb "$@"
}

set +e
if [ "${FRESH_CI:-0}" = 1 ]; then
  # CI's entry point instead (its set-up is the same ./setup.sh, then the whole suite).
  t1=$(date +%s)
  in_machine CI=true ${PYTEST_ADDOPTS:+"PYTEST_ADDOPTS=$PYTEST_ADDOPTS"} "${site_env[@]}" \
    /bin/bash -c 'cd /root/enkflow && bash .ci/run'
  rc=$?
  echo "fresh machine: .ci/run took $(( $(date +%s) - t1 )) s (exit status $rc)"
  exit $rc
fi
# The README's two commands, verbatim but for the test selection.
t1=$(date +%s)
in_machine "${site_env[@]}" /bin/bash -c 'cd /root/enkflow && nice -n 10 ./setup.sh'
rc=$?
echo "fresh machine: ./setup.sh took $(( $(date +%s) - t1 )) s (exit status $rc)"
if [ $rc = 0 ]; then
  t2=$(date +%s)
  in_machine "${site_env[@]}" /bin/bash -c \
    'cd /root/enkflow && . .venv/bin/activate && nice -n 10 python -m pytest -q "$@"' pytest "$@"
  rc=$?
  echo "fresh machine: the test command took $(( $(date +%s) - t2 )) s (exit status $rc)"
fi
exit $rc
