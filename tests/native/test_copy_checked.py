"""The copy that checks what it copies (native/src/copy_checked.h), which the runner library's PUT_SLOT and
the netCDF shim's puts use instead of memcpy and which tells the server whether it need read a forecast
again: tests/native/copy_checked_test.c against the obvious answer, built with the default streaming
threshold and with the streaming loop for every size, at -O0 and -O2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "native" / "src"


@pytest.mark.parametrize("flags", [["-O2"], ["-O2", "-DEKF_STREAM_MIN=0"], ["-O0", "-DEKF_STREAM_MIN=0"]],
                         ids=["default", "streaming", "streaming-O0"])
def test_the_copy_is_exact_and_finds_every_non_finite_value(tmp_path: Path, flags: list[str]) -> None:
    exe = tmp_path / "copy_checked_test"
    cc = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", *flags, f"-I{SRC}",
                         str(HERE / "copy_checked_test.c"), "-o", str(exe), "-lm"], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
