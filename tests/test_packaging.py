"""What an installed enkflow contains: the package, never a test or benchmark harness.

Builds the wheel from a copy of the working tree (so the build leaves nothing in
the checkout) and checks every file in it. Harnesses, such as the local SLURM
bootstrap that installs packages with apt-get, writes /etc/munge/munge.key and
cancels every job of root, live in ``testing/enkflow_testing/``.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Byte strings that only harness code contains: installing system packages, writing
# munge's key, starting munged, cancelling every job of a user.
HARNESS_MARKERS = (b"munge.key", b"munged", b"apt-get", b"scancel --user", b'"scancel", "--user', b"--user=root")
HARNESS_NAMES = ("localslurm", "enkflow_testing")
# Top-level entries a wheel may hold: the package and its metadata.
ALLOWED_TOP = {"enkflow"}

_SKIP_COPY = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so",
                                    ".pytest_cache", "bench-out")
_NO_BUILD_DEPS = ("Could not find a version that satisfies", "No matching distribution found",
                  "Failed to establish a new connection", "Temporary failure in name resolution")


def _version(dist: str) -> tuple[int, ...] | None:
    try:
        v = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(p) for p in v.split(".")[:2] if p.isdigit())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP_COPY, symlinks=True)
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(src)]
    # Offline and fast with the interpreter's own setuptools when it meets pyproject.toml's
    # build requirements; otherwise pip's isolated build, as `pip install` does.
    setuptools = _version("setuptools")
    isolated = not (setuptools is not None and setuptools >= (77,) and _version("wheel") is not None)
    if not isolated:
        argv.insert(4, "--no-build-isolation")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and isolated and any(s in out for s in _NO_BUILD_DEPS):
        pytest.skip(f"cannot fetch the build requirements (setuptools>=77, wheel) for an isolated build:\n{out[-2000:]}")
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{out[-4000:]}"
    (whl,) = (tmp / "dist").glob("enkflow-*.whl")
    return whl


@pytest.mark.slow
def test_the_wheel_holds_only_the_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == ALLOWED_TOP
    assert "enkflow/jobs/slurm.py" in names  # the SLURM launcher is product code and ships


@pytest.mark.slow
def test_the_wheel_contains_no_harness(wheel: Path) -> None:
    found: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.split("/", 1)[0].endswith(".dist-info"):
                continue  # metadata (METADATA quotes README.md)
            if any(h in name for h in HARNESS_NAMES):
                found.append(f"{name}: harness module")
                continue
            data = zf.read(name)
            found += [f"{name}: contains {m.decode()!r}" for m in HARNESS_MARKERS if m in data]
    assert not found, "test harness code in the installed package:\n" + "\n".join(found)
