"""What one read or update of the ensemble files moved, and how fast (:class:`TransferStats`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferStats:
    """What one read or update moved. ``nbytes``: state bytes of all N_e files (file dtypes);
    ``seconds``: wall time on this rank, barrier to barrier. For a safe update ``log_seconds``
    is the part spent writing the log (or the shadow files) and committing, ``prepare_seconds`` the log allocation
    (zero when :meth:`EnsembleFiles.prepare_update` ran before)."""

    nbytes: int
    seconds: float
    safe: bool = False
    log_seconds: float = 0.0
    prepare_seconds: float = 0.0

    @property
    def gbps(self) -> float:
        """Throughput in GB/s (1e9 bytes per second)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")
