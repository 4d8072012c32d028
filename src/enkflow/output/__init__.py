"""Asynchronous output server: writer processes, inline ensemble diagnostics, CF NetCDF files.

``out = Output(config)``; ``out.add(name, array, time, member=None, region=None)`` returns at
once; ``out.sync()`` waits until everything added is written; ``out.close()``. See docs/output.md.
"""

from typing import Any

from enkflow.output.config import DimSpec, FieldSpec, OutputConfig, WindowSpec

__all__ = ["DimSpec", "FieldSpec", "Output", "OutputConfig", "OutputError", "WindowSpec"]


def __getattr__(name: str) -> Any:
    # The client imports pyzmq: loaded on first use, so reading a configuration does not.
    if name in ("Output", "OutputError"):
        from enkflow.output import client

        return getattr(client, name)
    raise AttributeError(f"module 'enkflow.output' has no attribute {name!r}")
