"""The README's set-up and CI cannot drift apart: both run ./setup.sh, whose Debian packages are the
ones the README names (testing/fresh_machine.sh runs the README's commands on a fresh Debian)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _debian_packages() -> set[str]:
    text = (ROOT / "setup.sh").read_text()
    m = re.search(r"DEBIAN_PACKAGES=\((.*?)\)", text, re.S)
    assert m, "setup.sh defines DEBIAN_PACKAGES"
    return set(shlex.split(m.group(1)))


def test_readme_and_ci_run_the_same_set_up() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Set-up", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]
    assert commands == ["./setup.sh", ". .venv/bin/activate && python -m pytest -q"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "./setup.sh" in ci and "python -m pytest -q" in ci
    assert not any("apt-get" in line for line in ci if not line.startswith("#"))  # only setup.sh installs


def test_the_packages_the_native_parts_and_tests_need_are_installed_by_setup() -> None:
    packages = _debian_packages()
    needed = {"gcc", "gfortran", "make", "cmake", "pkg-config", "libzmq3-dev", "libnetcdf-dev", "libnetcdff-dev",
              "strace", "chromium", "chromium-driver", "python3-venv", "python3-dev"}
    assert needed <= packages, needed - packages
    readme = (ROOT / "README.md").read_text()
    assert [p for p in sorted(packages) if p not in readme] == []
