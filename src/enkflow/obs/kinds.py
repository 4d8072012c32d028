"""Observation kinds: each observation's settings from ``[observations.kinds.NAME]``, matched by the
file's kind code or by its name in the file's ``flag_meanings``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.obs.config import ObsSettingsConfig
from enkflow.obs.fileformat import KIND, ObsFile
from enkflow.obs.reader import Source, first


@dataclass(frozen=True)
class KindTable:
    """Per observation (each (n_obs,)): the kind's error factor, localization radius (NaN: the
    default), gross-error threshold (NaN: none) and observed state variable (None: the only one);
    ``names``: kind code -> name, the file's and the configured ones."""

    factor: np.ndarray
    radius: np.ndarray
    qc_sigma: np.ndarray
    variable: list[str | None]
    names: dict[int, str]


def kind_table(of: ObsFile, cfg: ObsSettingsConfig, src: Source) -> KindTable:
    """The kinds of ``of``'s observations against ``cfg.kinds``: where kinds are configured, every kind
    in the file must be one of them (FileFormatError naming ``kind`` and the first observation)."""
    kinds = of.obs.kinds
    n = kinds.size
    by_code = {k.code: name for name, k in cfg.kinds.items() if k.code is not None}
    names = dict(of.kind_names)
    factor, radius, qc = np.ones(n), np.full(n, np.nan), np.full(n, np.nan)
    variable = np.full(n, None, dtype=object)
    if cfg.qc.gross_sigma is not None:
        qc[:] = cfg.qc.gross_sigma
    for c in np.unique(kinds).tolist():
        name = by_code.get(c)
        if name is None and names.get(c) in cfg.kinds and cfg.kinds[names[c]].code is None:
            name = names[c]
        at = kinds == c
        if name is None:
            if cfg.kinds:
                i = first(at)
                label = f" ('{names[c]}' in its flag_meanings)" if c in names else ""
                raise src.fail(KIND, (
                    f"kind {c}{label} of observation {src.at(i)} is not a configured kind; [observations.kinds] has "
                    f"{', '.join(sorted(cfg.kinds))} (a kind is matched by its 'code', or by its name in the "
                    "file's flag_meanings)"))
            continue
        names[c] = name
        k = cfg.kinds[name]
        factor[at] = k.error_factor
        if k.radius is not None:
            radius[at] = k.radius
        if k.qc_sigma is not None:
            qc[at] = k.qc_sigma
        variable[at] = k.variable
    return KindTable(factor, radius, qc, variable.tolist(), names)
