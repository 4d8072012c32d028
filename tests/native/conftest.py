"""The native tree (``native/``: the C runner library, the Fortran module, the example models and
whatever else ``native/CMakeLists.txt`` adds) built once per test session with CMake into a temporary
directory and installed there. A missing tool fails the tests with what to run: ``./setup.sh``
(README.md) installs them, as CI does (``.ci/run`` runs it); nothing is skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "native"
APT = ("run ./setup.sh as root (or apt-get install gfortran cmake make pkg-config libzmq3-dev libsodium-dev "
       "libnetcdf-dev libnetcdff-dev)")


@dataclass(frozen=True)
class NativeBuild:
    """Where the session's build is: ``build`` the CMake build tree, ``prefix`` its install prefix."""

    source: Path
    build: Path
    prefix: Path

    @property
    def bin(self) -> Path:
        return self.prefix / "bin"

    @property
    def lib(self) -> Path:
        return self.prefix / "lib"

    @property
    def include(self) -> Path:
        return self.prefix / "include"

    def exe(self, name: str) -> Path:
        """An installed program of the tree (fails the test when it was not built)."""
        p = self.bin / name
        if not p.exists():
            pytest.fail(f"{name} was not built by {self.source}/CMakeLists.txt (see {self.build})")
        return p

    def env(self) -> dict[str, str]:
        """Environment in which the installed tree is found (pkg-config, the loader)."""
        env = dict(os.environ)
        env["PKG_CONFIG_PATH"] = os.pathsep.join(filter(None, [str(self.lib / "pkgconfig"), env.get("PKG_CONFIG_PATH")]))
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.lib), env.get("LD_LIBRARY_PATH")]))
        return env


def _run(argv: list[str], log: Path) -> None:
    with open(log, "ab") as fh:
        fh.write(f"$ {' '.join(argv)}\n".encode())
        fh.flush()
        rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        pytest.fail(f"building native/ failed ({' '.join(argv[:3])} ... exit {rc}); the tools it needs: {APT}\n"
                    + "\n".join(tail), pytrace=False)


@pytest.fixture(scope="session")
def native_build(tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    """``native/`` configured, built and installed with CMake (once per session)."""
    missing = [t for t in ("cmake", "pkg-config", "cc", "gfortran") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"the native tests need {', '.join(missing)}: {APT}", pytrace=False)
    root = tmp_path_factory.mktemp("native")
    b = NativeBuild(NATIVE, root / "build", root / "install")
    log = root / "build.log"
    _run(["cmake", "-S", str(NATIVE), "-B", str(b.build), f"-DCMAKE_INSTALL_PREFIX={b.prefix}",
          "-DCMAKE_INSTALL_LIBDIR=lib", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], log)
    _run(["cmake", "--build", str(b.build), "-j", str(min(4, os.cpu_count() or 1))], log)
    _run(["cmake", "--install", str(b.build)], log)
    return b


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The outputs of the Python demo model's offline run (demo_study), made once per session."""
    from demo_study import offline_reference, outputs

    d = offline_reference(tmp_path_factory.mktemp("offline"))
    return outputs(d, d / "run")


@pytest.fixture(scope="session")
def slices_runner(native_build: NativeBuild, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/native/slices_runner.c built against the session's library: one runner of NRANKS thread ranks."""
    env = native_build.env()
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "enkflow_runner"], env=env, capture_output=True,
                           text=True, check=True).stdout.split()
    exe = tmp_path_factory.mktemp("slices") / "slices_runner"
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-pthread", str(Path(__file__).parent / "slices_runner.c"),
                         "-o", str(exe), *flags, f"-Wl,-rpath,{native_build.lib}"], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    return exe
