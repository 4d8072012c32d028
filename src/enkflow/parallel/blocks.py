"""Row-block decomposition of the state vector across ranks."""

from __future__ import annotations

from dataclasses import dataclass

from enkflow.errors import InputError


@dataclass(frozen=True, slots=True)
class RowBlocks:
    """Each of ``n_ranks`` ranks owns ``ceil(n_rows / n_ranks)`` consecutive rows.

    The last ranks may own fewer (or zero) rows. Rows are state-vector indices,
    the same for every member.
    """

    n_rows: int
    n_ranks: int

    def __post_init__(self) -> None:
        if self.n_rows < 0:
            raise InputError(f"n_rows must be >= 0, got {self.n_rows}", item="n_rows")
        if self.n_ranks < 1:
            raise InputError(f"n_ranks must be >= 1, got {self.n_ranks}", item="n_ranks")

    @property
    def block(self) -> int:
        """Rows per rank (the last ranks may hold fewer)."""
        return -(-self.n_rows // self.n_ranks) if self.n_rows else 0

    def start(self, rank: int) -> int:
        return min(rank * self.block, self.n_rows)

    def stop(self, rank: int) -> int:
        return min((rank + 1) * self.block, self.n_rows)

    def bounds(self, rank: int) -> tuple[int, int]:
        """``(start, stop)`` of the rows owned by ``rank``."""
        return self.start(rank), self.stop(rank)

    def size(self, rank: int) -> int:
        return self.stop(rank) - self.start(rank)

    def owner(self, row: int) -> int:
        """The rank owning state row ``row``."""
        if not 0 <= row < self.n_rows:
            raise InputError(f"row {row} outside [0, {self.n_rows})", item="row", index=row)
        return row // self.block

    def counts(self) -> list[int]:
        return [self.size(r) for r in range(self.n_ranks)]
