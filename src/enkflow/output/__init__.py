"""Asynchronous output server: writer processes, inline ensemble diagnostics, CF NetCDF files.

``out = Output(config)``; ``out.add(name, array, time, member=None, region=None)`` returns at
once; ``out.sync()`` waits until everything added is written; ``out.close()``. See docs/output.md.
"""

from enkflow.output.client import Output, OutputError
from enkflow.output.config import DimSpec, FieldSpec, OutputConfig, WindowSpec

__all__ = ["DimSpec", "FieldSpec", "Output", "OutputConfig", "OutputError", "WindowSpec"]
