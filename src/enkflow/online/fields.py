"""The fields of a member's state and who owns which elements of them.

A member's state is several named fields (name, dtype, shape), each either
*assimilated* (its elements are rows of the state vector the analysis
updates) or *carried* (a restart-only part the model needs back, untouched by
the analysis). The assimilated fields, flattened in C order and concatenated
in their declared order, form the state vector of ``n_rows`` rows; server rank
``r`` of ``P`` owns the rows ``RowBlocks(n_rows, P).bounds(r)`` of it (the same
rows the offline analysis gives rank ``r``), and the same block share of each
carried field. Ranges are in elements, 64-bit, and never split an element.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.errors import InputError
from enkflow.parallel import RowBlocks

_DTYPES = ("float64", "float32", "int32", "int64")


@dataclass(frozen=True)
class Field:
    """One field of a member's state: ``shape`` of the whole field (all runner ranks together)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    assimilated: bool = True

    def __post_init__(self) -> None:
        if not self.name or not self.name.isprintable() or len(self.name) > 256:
            raise InputError(f"invalid field name {self.name!r}", item="field")
        dt = np.dtype(self.dtype).name
        if dt not in _DTYPES:
            raise InputError(f"field {self.name!r}: dtype {self.dtype!r} is not one of {', '.join(_DTYPES)}", item="field")
        if self.assimilated and not dt.startswith("float"):
            raise InputError(f"field {self.name!r}: an assimilated field must be float32 or float64, not {dt}", item="field")
        shape = tuple(int(s) for s in self.shape)
        if any(s < 0 for s in shape):
            raise InputError(f"field {self.name!r}: negative extent in shape {shape}", item="field")
        object.__setattr__(self, "dtype", dt)
        object.__setattr__(self, "shape", shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def as_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "assimilated": self.assimilated}

    @classmethod
    def from_json(cls, d: dict) -> "Field":
        try:
            return cls(str(d["name"]), str(d["dtype"]), tuple(int(s) for s in d["shape"]), bool(d.get("assimilated", True)))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"bad field description {d!r}: {exc}", item="field") from None


def describe_mismatch(expected: list[Field], got: list[Field]) -> str | None:
    """What differs between the server's fields and a runner's, or None when they agree."""
    e = {f.name: f for f in expected}
    g = {f.name: f for f in got}
    problems = []
    for name in e.keys() - g.keys():
        problems.append(f"field {name!r} missing")
    for name in g.keys() - e.keys():
        problems.append(f"unknown field {name!r} (the server expects {', '.join(sorted(e))})")
    for name in e.keys() & g.keys():
        a, b = e[name], g[name]
        for attr in ("dtype", "shape", "assimilated"):
            if getattr(a, attr) != getattr(b, attr):
                problems.append(f"field {name!r}: {attr} {getattr(b, attr)!r}, the server expects {getattr(a, attr)!r}")
    if not problems and [f.name for f in expected] != [f.name for f in got]:
        problems.append(f"fields in the order {[f.name for f in got]}, the server expects {[f.name for f in expected]}")
    return "; ".join(sorted(problems)) if problems else None


@dataclass(frozen=True)
class Ownership:
    """Which elements of each field server rank ``r`` of ``n_ranks`` owns: ``ranges[r][f] = (lo, hi)``."""

    fields: tuple[Field, ...]
    n_ranks: int

    @property
    def n_rows(self) -> int:
        """Rows of the state vector: the elements of the assimilated fields."""
        return sum(f.size for f in self.fields if f.assimilated)

    def rows(self, rank: int) -> tuple[int, int]:
        """The state-vector rows of ``rank``."""
        return RowBlocks(self.n_rows, self.n_ranks).bounds(rank)

    def range(self, rank: int, field: int) -> tuple[int, int]:
        """``(lo, hi)`` elements of field ``field`` that ``rank`` owns."""
        f = self.fields[field]
        if f.assimilated:
            off = sum(g.size for g in self.fields[:field] if g.assimilated)
            r0, r1 = self.rows(rank)
            return min(max(r0 - off, 0), f.size), min(max(r1 - off, 0), f.size)
        return RowBlocks(f.size, self.n_ranks).bounds(rank)

    def table(self) -> np.ndarray:
        """``(n_ranks, n_fields, 2)`` int64: every rank's range of every field."""
        return np.array([[self.range(r, k) for k in range(len(self.fields))] for r in range(self.n_ranks)],
                        dtype=np.int64).reshape(self.n_ranks, len(self.fields), 2)

    def pieces(self, field: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """The element range ``[lo, hi)`` of field ``field`` split by owner: ``(rank, lo, hi)`` pieces."""
        out = []
        for r in range(self.n_ranks):
            a, b = self.range(r, field)
            a, b = max(a, lo), min(b, hi)
            if a < b:
                out.append((r, a, b))
        return out
