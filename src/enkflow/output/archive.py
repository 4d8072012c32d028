"""Background archiving of each cycle's restarts (offline) or analysis checkpoints (online).

After a cycle, the files that restart the experiment from that cycle are first
*staged*: cloned (reflink where the file system has them, else
``copy_file_range``) into ``EXPDIR/archive/staging/cycle_NNNN``, which takes one
file-system copy and lets the next forecast rewrite the restarts at once. A
separate, low-priority process (``python -m enkflow.output.archive``) then
compresses every staged file (gzip), writes it to the archive directory with its
SHA-256 and that of its uncompressed content, and keeps the archive to a
retention policy::

    ARCHIVE/cycle_0003/member_0001.nc.gz ...   compressed copies
    ARCHIVE/cycle_0003/MANIFEST.json           names, targets, sizes, SHA-256s (written last)

Nothing lies under a final name until it is complete: a cycle is written into
``ARCHIVE/.cycle_NNNN.tmp.PID`` (every file and the manifest fsynced, the
manifest last) and renamed to ``cycle_NNNN`` as a whole; a staged cycle is
likewise a renamed temporary directory. A ``kill -9`` of the archiver leaves a
temporary directory that the next archiver (of the next cycle, or of a rerun)
removes, and the staged cycle, which it archives again.

:func:`restore` verifies every checksum of an archived cycle before it writes
anything (an error names the file whose checksum fails), then puts each file
back under its target name atomically (temporary sibling + rename).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from enkflow.errors import EnkflowError, StorageError
from enkflow.fsutil import fsync_dir, pid_alive, write_json_atomic
from enkflow.jobs.events import EventLog
from enkflow.jobs.protect import clone_file

MANIFEST = "MANIFEST.json"
VERSION = 1
CHUNK = 1 << 22  # bytes read, hashed and compressed at a time
_CYCLE = re.compile(r"^cycle_(\d+)$")
_TMP = re.compile(r"^\.cycle_(\d+)\.(?:tmp|old)\.(\d+)$")


class ArchiveError(EnkflowError):
    """An archive that is missing, incomplete or fails its checksums (names the file)."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


@dataclass(frozen=True)
class Policy:
    """Retention: the ``keep_last`` newest archived cycles, plus every cycle divisible by
    ``keep_every`` (0: none), are kept; the others are removed after each new archive."""

    keep_last: int = 3
    keep_every: int = 0
    level: int = 1  # zlib level: 1 compresses restarts of smooth fields well at a fraction of level 6's time
    compression: str = "gzip"  # or "none"

    def keep(self, cycles: list[int]) -> set[int]:
        newest = sorted(cycles)[-self.keep_last:] if self.keep_last > 0 else list(cycles)
        every = {c for c in cycles if self.keep_every > 0 and c % self.keep_every == 0}
        return set(newest) | every


def cycle_dir(root: Path, cycle: int) -> Path:
    return Path(root) / f"cycle_{cycle:04d}"


def listed_cycles(root: Path) -> list[int]:
    """The cycles complete under ``root`` (a directory ``cycle_NNNN`` holding its manifest), oldest first."""
    out = []
    for p in Path(root).glob("cycle_*"):
        m = _CYCLE.match(p.name)
        if m and (p / MANIFEST).is_file():
            out.append(int(m.group(1)))
    return sorted(out)


def remove_stale(root: Path) -> list[Path]:
    """Remove the temporary directories of archivers (or stagings) that died; returns them."""
    gone = []
    for p in Path(root).glob(".cycle_*"):
        m = _TMP.match(p.name)
        if m and not pid_alive(int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the complete directory ``tmp`` to ``final``; an older ``final`` (a cycle archived
    again, e.g. after a restore from an earlier cycle) is replaced."""
    fsync_dir(tmp)
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- staging (in the driver or server, between the analysis and the next forecast) -----------------------


def stage(staging_root: Path, cycle: int, files: list[tuple[Path, str, str]], meta: dict, *, link: bool = False) -> Path:
    """Snapshot ``files`` [(source, archived name, target key)] of ``cycle`` into
    ``staging_root/cycle_NNNN`` (reflink or ``copy_file_range``; with ``link``, a hard link, free,
    for files that are replaced by rename and never rewritten in place, such as the online
    checkpoints; a copy where the link is impossible), with ``stage.json`` holding ``meta`` and
    the names; atomically (a temporary directory renamed). Returns the directory. The target
    key is what :func:`restore` maps to a path (e.g. ``member:3``)."""
    staging_root = Path(staging_root)
    staging_root.mkdir(parents=True, exist_ok=True)
    remove_stale(staging_root)
    final = cycle_dir(staging_root, cycle)
    tmp = staging_root / f".cycle_{cycle:04d}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        entries = []
        for src, name, target in files:
            if link:
                try:
                    os.link(src, tmp / name)
                    entries.append({"name": name, "target": target})
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
            clone_file(Path(src), tmp / name)
            entries.append({"name": name, "target": target})
        write_json_atomic(tmp / "stage.json", {"cycle": cycle, "files": entries, "meta": meta, "t": time.time()})
        _publish(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise StorageError.from_os_error(exc, path=str(final)) from None
    return final


def staged_cycles(staging_root: Path) -> list[int]:
    out = []
    for p in Path(staging_root).glob("cycle_*"):
        m = _CYCLE.match(p.name)
        if m and (p / "stage.json").is_file():
            out.append(int(m.group(1)))
    return sorted(out)


# -- archiving (the background process) -------------------------------------------------------------------


def _compress(src: Path, dst: Path, policy: Policy) -> dict:
    """Copy ``src`` to ``dst`` (gzip, or as is), fsynced; the SHA-256 and size of both sides."""
    raw, packed = hashlib.sha256(), hashlib.sha256()
    n_raw = n_packed = 0
    comp = zlib.compressobj(policy.level, zlib.DEFLATED, 31) if policy.compression == "gzip" else None  # 31: gzip wrapper
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while True:
            block = fi.read(CHUNK)
            if not block:
                break
            raw.update(block)
            n_raw += len(block)
            out = comp.compress(block) if comp is not None else block
            packed.update(out)
            n_packed += len(out)
            fo.write(out)
        if comp is not None:
            out = comp.flush()
            packed.update(out)
            n_packed += len(out)
            fo.write(out)
        fo.flush()
        os.fsync(fo.fileno())
    return {"sha256": packed.hexdigest(), "bytes": n_packed, "sha256_raw": raw.hexdigest(), "bytes_raw": n_raw}


def archive_staged(staging_root: Path, archive_root: Path, policy: Policy) -> list[dict]:
    """Archive every staged cycle, oldest first (removing each staged copy once archived), then
    apply the retention policy. Returns one summary per cycle archived."""
    staging_root, archive_root = Path(staging_root), Path(archive_root)
    archive_root.mkdir(parents=True, exist_ok=True)
    remove_stale(archive_root)
    done: list[dict] = []
    while pending := [c for c in staged_cycles(staging_root) if c not in {d["cycle"] for d in done}]:
        cycle = pending[0]  # listed again each time: cycles staged meanwhile are archived too
        sdir = cycle_dir(staging_root, cycle)
        spec = json.loads((sdir / "stage.json").read_text())
        t0 = time.perf_counter()
        tmp = archive_root / f".cycle_{cycle:04d}.tmp.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = []
        try:
            for e in spec["files"]:
                name = e["name"] + (".gz" if policy.compression == "gzip" else "")
                files.append({"name": name, "target": e["target"], "source_name": e["name"],
                              **_compress(sdir / e["name"], tmp / name, policy)})
            manifest = {"version": VERSION, "cycle": cycle, "compression": policy.compression, "files": files,
                        "meta": spec.get("meta", {}), "created": time.time()}
            # The manifest last: a directory with a manifest holds every file it lists.
            with open(tmp / MANIFEST, "w") as fh:
                json.dump(manifest, fh, indent=1, sort_keys=True)
            _fsync_file(tmp / MANIFEST)
            _publish(tmp, cycle_dir(archive_root, cycle))
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StorageError.from_os_error(exc, path=str(cycle_dir(archive_root, cycle))) from None
        shutil.rmtree(sdir, ignore_errors=True)
        done.append({"cycle": cycle, "files": len(files), "bytes": sum(f["bytes"] for f in files),
                     "bytes_raw": sum(f["bytes_raw"] for f in files), "archive_s": time.perf_counter() - t0})
    if done:
        prune(archive_root, policy)
    return done


def prune(archive_root: Path, policy: Policy) -> list[int]:
    """Remove the archived cycles the policy does not keep; returns them."""
    cycles = listed_cycles(archive_root)
    keep = policy.keep(cycles)
    gone = [c for c in cycles if c not in keep]
    for c in gone:
        d = cycle_dir(archive_root, c)
        old = d.with_name(f".{d.name}.old.{os.getpid()}")
        os.replace(d, old)  # the cycle leaves the listing at once, whole
        shutil.rmtree(old, ignore_errors=True)
    return gone


# -- verification and restore -----------------------------------------------------------------------------


def read_manifest(archive_root: Path, cycle: int) -> dict:
    d = cycle_dir(archive_root, cycle)
    path = d / MANIFEST
    if not path.is_file():
        have = listed_cycles(archive_root)
        listing = ", ".join(map(str, have)) if have else "none"
        raise ArchiveError(f"no complete archive of cycle {cycle} (archived cycles: {listing})", path=str(d))
    try:
        manifest = json.loads(path.read_text())
    except ValueError as exc:
        raise ArchiveError(f"unreadable manifest: {exc}", path=str(path)) from None
    if manifest.get("version") != VERSION or int(manifest.get("cycle", -1)) != cycle:
        raise ArchiveError(f"manifest of version {manifest.get('version')} for cycle {manifest.get('cycle')}, "
                           f"expected version {VERSION} for cycle {cycle}", path=str(path))
    return manifest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def verify(archive_root: Path, cycle: int) -> dict:
    """Check every archived file of ``cycle`` against the manifest's SHA-256 of its compressed
    bytes; returns the manifest. Raises :class:`ArchiveError` naming the first file that is
    missing or fails."""
    manifest = read_manifest(archive_root, cycle)
    d = cycle_dir(archive_root, cycle)
    for f in manifest["files"]:
        p = d / f["name"]
        if not p.is_file():
            raise ArchiveError("listed in the manifest but missing", path=str(p))
        if _sha256(p) != f["sha256"]:
            raise ArchiveError(f"SHA-256 checksum mismatch (the manifest says {f['sha256']}): the archived file is "
                               "corrupted; restore from another cycle", path=str(p))
    return manifest


def restore(archive_root: Path, cycle: int, targets: dict[str, Path], *,
            check: Callable[[dict], None] | None = None, before_write: Callable[[], None] | None = None) -> dict:
    """Put the archived files of ``cycle`` back: ``targets`` maps each manifest target key to its
    path. Every compressed checksum is verified first (and ``check(manifest)`` run, which may
    raise), then every file is decompressed to a temporary sibling of its target and its content
    checksum verified; only when all are verified is ``before_write()`` called and are the files
    renamed into place. Returns the manifest."""
    manifest = verify(archive_root, cycle)
    if check is not None:
        check(manifest)
    d = cycle_dir(archive_root, cycle)
    missing = sorted({f["target"] for f in manifest["files"]} - set(targets))
    if missing:
        raise ArchiveError(f"the archive holds files for {', '.join(missing)}, which this experiment does not have "
                           "(another configuration?)", path=str(d / MANIFEST))
    staged: list[tuple[Path, Path]] = []
    try:
        for f in manifest["files"]:
            dst = Path(targets[f["target"]])
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(f".{dst.name}.restore.{os.getpid()}.tmp")
            staged.append((tmp, dst))
            raw = hashlib.sha256()
            dec = zlib.decompressobj(31) if manifest.get("compression") == "gzip" else None
            try:
                with open(d / f["name"], "rb") as fi, open(tmp, "wb") as fo:
                    while block := fi.read(CHUNK):
                        out = dec.decompress(block) if dec is not None else block
                        raw.update(out)
                        fo.write(out)
                    if dec is not None:
                        out = dec.flush()
                        raw.update(out)
                        fo.write(out)
                    fo.flush()
                    os.fsync(fo.fileno())
            except zlib.error as exc:
                raise ArchiveError(f"cannot decompress: {exc}", path=str(d / f["name"])) from None
            if raw.hexdigest() != f["sha256_raw"]:
                raise ArchiveError("the decompressed content fails its SHA-256 checksum", path=str(d / f["name"]))
        if before_write is not None:
            before_write()
        for tmp, dst in staged:
            os.replace(tmp, dst)
            fsync_dir(dst.parent)
    except OSError as exc:
        raise StorageError.from_os_error(exc, path=str(exc.filename or d)) from None
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    return manifest


# -- the process ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m enkflow.output.archive STAGING ARCHIVE [--events F] [--keep-last K] ...``: archive
    every staged cycle; exit 0 when done, 1 with the error on stderr."""
    p = argparse.ArgumentParser(prog="python -m enkflow.output.archive")
    p.add_argument("staging")
    p.add_argument("archive")
    p.add_argument("--events", default=None, help="events.jsonl to append archive_end events to")
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--keep-every", type=int, default=0)
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--compression", default="gzip", choices=["gzip", "none"])
    p.add_argument("--nice", type=int, default=10, help="lower this process's CPU priority by this much")
    a = p.parse_args(argv)
    if a.nice:
        try:
            os.nice(a.nice)
        except OSError:
            pass
    policy = Policy(a.keep_last, a.keep_every, a.level, a.compression)
    events = None
    if a.events:
        events = EventLog(a.events)
    try:
        for summary in archive_staged(Path(a.staging), Path(a.archive), policy):
            if events is not None:
                events.emit("archive_end", **summary, dir=str(cycle_dir(Path(a.archive), summary["cycle"])))
    except (EnkflowError, OSError, ValueError, KeyError) as exc:
        print(f"enkflow archiver: error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
