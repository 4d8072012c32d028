"""The online benchmarks' check of the exchanged data (``--check``): exact checksums of every state.

A runner checksums every state it got and every forecast it sent; the server
the initial ensemble, every forecast the analysis saw and every analysis.
:func:`verify` matches them: every state a runner got must equal the member's
previous analysis (or initial state), every forecast the analysis saw must
equal what a runner sent.
"""

from __future__ import annotations

import numpy as np

from enkflow.parallel import Comm

_MASK = (1 << 64) - 1


def checksum(x: np.ndarray, start: int = 0) -> int:
    """Exact, order-independent and position-sensitive: sum of (bits of x[i]) * (start + i + 1) mod 2**64.

    The checksums of the pieces of a vector (each with its start) add up, mod 2**64, to the whole's.
    """
    x = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    idx = np.arange(start + 1, start + 1 + x.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(np.multiply(x.view(np.uint64), idx).sum(dtype=np.uint64))


def member_sums(X: np.ndarray, row_start: int, comm: Comm) -> list[int]:
    """Every member's checksum of the rows ``X`` (n_rows, N) of every rank (collective)."""
    mine = [checksum(X[:, j], row_start) for j in range(X.shape[1])]
    every = comm.allgather_obj(mine)
    return [sum(r[j] for r in every) & _MASK for j in range(X.shape[1])]


def verify(rec: dict, members: int, cycles: int) -> list[str]:
    """With ``--check``: the problems found in the exchanged data (empty: all right). ``rec``: the
    server's record with the runners' (:func:`~enkflow.bench.online_study.online_study`)."""
    problems = []
    init = rec["initial"]
    analyses = {int(k): v for k, v in rec["analyses"].items()}
    forecasts = {int(k): v for k, v in rec["forecasts"].items()}
    sent: dict[tuple[int, int], set[int]] = {}
    seen = set()
    for r in rec["runners"]:
        for cycle, member, got, put in r["tasks"]:
            want = init[member - 1] if cycle == 1 else analyses.get(cycle - 1, [None] * members)[member - 1]
            if got != want:
                problems.append(f"cycle {cycle}, member {member}: the runner got another state than the server held")
            sent.setdefault((cycle, member), set()).add(put)
            seen.add((cycle, member))
    for k in range(1, cycles + 1):
        for m in range(1, members + 1):
            if (k, m) not in seen:
                problems.append(f"cycle {k}, member {m}: no runner ran it")
            elif forecasts.get(k, [None] * members)[m - 1] not in sent[(k, m)]:
                problems.append(f"cycle {k}, member {m}: the analysis saw another forecast than the runner sent")
    return problems
