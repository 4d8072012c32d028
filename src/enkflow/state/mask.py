"""Masks: which elements of a gridded variable are state points."""

from __future__ import annotations

import numpy as np

from enkflow.errors import InputError


def mask_index(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Flat C-order element indices selected by ``mask`` in a variable of ``shape``.

    ``mask`` (bool) spans the trailing dimensions of ``shape``; it is repeated along the
    leading ones (a 2-D land mask selects the same points on every level of a 3-D variable).
    Returns an ascending int64 array.
    """
    mask = np.asarray(mask, dtype=bool)
    nt = mask.ndim
    if tuple(shape[len(shape) - nt:]) != mask.shape:
        raise InputError(f"mask of shape {mask.shape} does not match the trailing dims of {shape}", item="mask")
    inner = np.flatnonzero(mask.reshape(-1)).astype(np.int64)
    lead = int(np.prod(shape[: len(shape) - nt], dtype=np.int64))
    if lead == 1:
        return inner
    block = int(mask.size)
    return (np.arange(lead, dtype=np.int64)[:, None] * block + inner[None, :]).reshape(-1)
