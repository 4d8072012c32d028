"""``[output]``: the asynchronous output server (``enkflow.output``), see docs/output.md.

A field is declared once, with its dimensions; every array added for it must have that shape (or,
with ``region``, fit inside it). Times are numbers in ``time_units`` (CF: ``"hours since ..."``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from enkflow.config import Strict

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_REDUCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class DimSpec(Strict):
    """``[output.dims.NAME]``: one dimension of the output fields and its coordinate variable."""

    size: int = Field(ge=1, description="number of points")
    start: float | None = Field(default=None, description="first coordinate value (with step: a regular axis); "
                                                          "none: no coordinate variable unless Output(coords=...) gives one")
    step: float = Field(default=1.0, description="coordinate spacing")
    units: str | None = Field(default=None, description="CF units of the coordinate, e.g. degrees_north")
    standard_name: str | None = Field(default=None, description="CF standard_name, e.g. latitude")
    long_name: str | None = None
    axis: Literal["X", "Y", "Z"] | None = Field(default=None, description="CF axis attribute")


class FieldSpec(Strict):
    """``[output.fields.NAME]``: one output field."""

    dims: list[str] = Field(description="dimension names, each declared in [output.dims], slowest first")
    units: str | None = Field(default=None, description="CF units")
    standard_name: str | None = None
    long_name: str | None = None
    ensemble: bool = Field(default=True, description="one array per member (member = 1..members at add); "
                                                     "false: one array per time (member = None)")
    dtype: Literal["float32", "float64", "int16"] = Field(
        default="float32", description="stored type of the field; int16: 16-bit packing over pack_range with "
                                       "scale_factor/add_offset and the packing error bound as an attribute")
    pack_range: tuple[float, float] | None = Field(
        default=None, description="[min, max] of the values, required with dtype = 'int16'; a value outside is an error")

    @model_validator(mode="after")
    def _packing(self) -> "FieldSpec":
        if self.dtype == "int16":
            if self.pack_range is None:
                raise ValueError("dtype = 'int16' (16-bit packing) needs pack_range = [min, max]")
            lo, hi = self.pack_range
            if not hi > lo:
                raise ValueError(f"pack_range must be [min, max] with max > min, got {list(self.pack_range)}")
        return self

    def pack_bounds(self) -> tuple[float, float]:
        """``pack_range`` of a field packed to 16 bits (``dtype = 'int16'``, which requires it)."""
        if self.pack_range is None:
            raise ValueError(f"a field of dtype {self.dtype!r} has no pack_range (only int16 fields are packed)")
        return self.pack_range


class WindowSpec(Strict):
    """``[[output.windows]]``: time mean, minimum and maximum over consecutive windows of ``length``."""

    name: str = Field(description="name of the window, used in file names (e.g. 'daily')")
    length: float = Field(gt=0, description="window length in time units; window k covers [k length, (k+1) length)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"window name {v!r}: letters, digits and _ only, starting with a letter")
        return v


class OutputConfig(Strict):
    """``[output]``: writer processes, buffers, diagnostics and the NetCDF files they write."""

    directory: str = Field(default="output", description="where the files go (relative: to the experiment file)")
    file: str = Field(default="{field}.nc", description="file of one field (and window): without {time}, one "
                                                      "file per field that grows along time (CDF-5, crash-safe "
                                                      "appends); with {time}, one NetCDF-4 file per field and time")
    members: int = Field(default=0, ge=0, description="ensemble size N_e of ensemble fields (0: no ensemble fields)")
    dims: dict[str, DimSpec] = Field(default_factory=dict)
    fields: dict[str, FieldSpec] = Field(default_factory=dict)
    write_members: bool = Field(default=True, description="write the members' fields; false: diagnostics only "
                                                          "(the reduction is done inline, the full fields are dropped)")
    diagnostics: bool = Field(default=True, description="ensemble mean and spread (ddof = 1) per time, in float64")
    windows: list[WindowSpec] = Field(default_factory=list)
    reductions: dict[str, str] = Field(default_factory=dict, description="name = 'module:function': f(array) -> "
                                       "number or 1-D array, over the ensemble mean (or the field) of each time")
    writers: int = Field(default=1, ge=1, description="writer processes; the fields are dealt among them")
    transport: Literal["shm", "ipc", "tcp"] = Field(
        default="shm", description="shm: arrays copied into a shared-memory ring on this node, ZeroMQ carries "
                                   "the notices; ipc/tcp: arrays sent as ZeroMQ frames")
    bind: str = Field(default="127.0.0.1", description="interface the writers listen on with transport = 'tcp'")
    buffer_mb: float = Field(default=64.0, gt=0, description="bytes in flight per writer (MiB, 2**20) before add blocks")
    compression: Literal["none", "zlib", "zstd"] | None = Field(
        default=None, description="of the files per time (file with {time}, NetCDF-4; unset: zlib); the growing "
                                  "files (CDF-5) have none")
    complevel: int = Field(default=1, ge=1, le=9)
    nan: Literal["error", "warn", "allow"] = Field(
        default="error", description="NaN in a field: error (the writer reports it, that time's file is not "
                                     "written), warn (written, warned and counted) or allow (written, counted)")
    on_writer_failure: Literal["stop", "continue"] = Field(
        default="stop", description="a writer that dies or fails: stop (the next add/sync/close raises) or "
                                    "continue (its output is lost, reported loudly, the model goes on)")
    writer_timeout: float = Field(
        default=60.0, ge=0, description="seconds a writer may go without progress (no piece finished, no "
                                        "idle turn of its loop, no byte written) before it counts as failed: "
                                        "it is killed and on_writer_failure applies; 0: wait forever")
    writer_nice: int = Field(
        default=10, ge=0, le=19, description="niceness the writers add to the model's: I/O servers off the "
                                             "critical path yield the CPU to the model; 0: same priority")
    writer_cpus: list[int] = Field(
        default_factory=list, description="CPUs the writers are pinned to (os.sched_setaffinity); empty: not pinned")
    time_units: str = Field(default="hours since 2000-01-01 00:00:00", description="CF units of the times")
    calendar: str = "standard"
    title: str = "enkflow output"

    @field_validator("fields", "dims", "reductions")
    @classmethod
    def _names(cls, v: dict) -> dict:
        for name in v:
            if not _NAME.match(name):
                raise ValueError(f"name {name!r}: letters, digits and _ only, starting with a letter")
        return v

    @field_validator("reductions")
    @classmethod
    def _reductions(cls, v: dict[str, str]) -> dict[str, str]:
        for name, target in v.items():
            if not _REDUCTION.match(target):
                raise ValueError(f"reduction {name} = {target!r}: expected 'module:function'")
        return v

    @field_validator("writer_cpus")
    @classmethod
    def _cpus(cls, v: list[int]) -> list[int]:
        if any(c < 0 for c in v):
            raise ValueError(f"writer_cpus {v}: CPU numbers are >= 0")
        return v

    @field_validator("file")
    @classmethod
    def _file(cls, v: str) -> str:
        try:
            v.format(field="x", time=1.5)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"file template {v!r}: {exc} (placeholders: {{field}} {{time}})") from None
        if "{field" not in v:
            raise ValueError(f"file template {v!r} must hold {{field}} (one file per field, or per field and "
                             "time with {time})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "OutputConfig":
        for name, f in self.fields.items():
            for d in f.dims:
                if d not in self.dims:
                    raise ValueError(f"fields.{name}: dimension {d!r} is not declared in [output.dims] "
                                     f"(declared: {', '.join(sorted(self.dims)) or 'none'})")
            if len(set(f.dims)) != len(f.dims):
                raise ValueError(f"fields.{name}: a dimension is repeated in {f.dims}")
            if f.ensemble and self.members < 1:
                raise ValueError(f"fields.{name} is an ensemble field: set output.members (the ensemble size), "
                                 "or ensemble = false")
        reserved = {"time", "member"}
        clash = reserved & (set(self.dims) | set(self.fields))
        if clash:
            raise ValueError(f"{', '.join(sorted(clash))}: reserved names (the output's own coordinates)")
        if set(self.dims) & set(self.fields):
            raise ValueError(f"a name is both a dimension and a field: {sorted(set(self.dims) & set(self.fields))}")
        if self.series and self.compression not in (None, "none"):
            raise ValueError(f"compression = {self.compression!r} needs one NetCDF-4 file per time (a file template "
                             f"with {{time}}); file = {self.file!r} gives one file per field growing along time, "
                             "CDF-5, which has no compression (its appends are crash-safe)")
        names = [w.name for w in self.windows]
        if len(set(names)) != len(names):
            raise ValueError(f"window names repeat: {names}")
        return self

    @property
    def series(self) -> bool:
        """Whether each field (and window) has one file that grows along time (``file`` without ``{time}``)."""
        return "{time" not in self.file

    def shape(self, field: str) -> tuple[int, ...]:
        """The global shape of ``field`` (its dimensions' sizes)."""
        return tuple(self.dims[d].size for d in self.fields[field].dims)

    def reduced(self, field: str) -> bool:
        """Whether the writer reduces ``field`` in float64: ensemble mean and spread, windows, user reductions."""
        return (self.fields[field].ensemble and self.diagnostics) or bool(self.windows) or bool(self.reductions)

    def narrowed(self, field: str) -> bool:
        """Whether pieces of ``field`` travel as float32: stored as float32 and reduced by nothing, so the
        sender's cast gives the values the writer's would, with half the bytes to copy and carry."""
        return self.fields[field].dtype == "float32" and not self.reduced(field)
