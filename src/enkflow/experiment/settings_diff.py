"""Which settings a resumed experiment would change, key by key, with the old and new values.

A resume refuses settings that finished steps depended on (:mod:`enkflow.experiment.state`); the
refusal names every dotted key that differs from the configuration the experiment recorded
(``EXPDIR/config.json``), e.g. ``analysis.inflation.prior: 1.05 -> 1.1``, and list items by index
(``observations.kinds[1].error``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from enkflow.errors import EnkflowError
from enkflow.experiment.config import ExperimentConfig, digest_of, experiment_from_json
from enkflow.fsutil import read_json


class _Unset(Enum):
    """A key one of the two configurations does not have."""

    UNSET = "unset"


UNSET = _Unset.UNSET


@dataclass(frozen=True)
class SettingChange:
    """``key`` (dotted, as in the TOML) was ``old`` and is ``new`` (:data:`UNSET` where not given)."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: {_show(self.old)} -> {_show(self.new)}"


def _show(value: Any) -> str:
    if value is UNSET or value is None:
        return "(not set)"
    return json.dumps(value)


def changed_settings(old: Any, new: Any, key: str = "") -> list[SettingChange]:
    """Every leaf that differs between the JSON-like values ``old`` and ``new``, in key order;
    lists of equal length are compared item by item, others as a whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[SettingChange] = []
        for k in sorted(set(old) | set(new), key=str):
            out += changed_settings(old.get(k, UNSET), new.get(k, UNSET), f"{key}.{k}" if key else str(k))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in changed_settings(a, b, f"{key}[{i}]")]
    return [] if old == new else [SettingChange(key, old, new)]


def _by_section(part: str, settings: dict[str, Any]) -> dict[str, Any]:
    """A part of :meth:`ExperimentConfig.digest_parts` keyed by TOML section: the ``model`` part holds
    ``[model]``'s keys and the ``[online]`` keys a forecast depends on under ``online``."""
    if part != "model":
        return settings
    model = dict(settings)
    online = model.pop("online", None)
    return {"model": model} | ({"online": online} if online is not None else {})


def recorded_changes(cfg: ExperimentConfig, part: str, recorded_digest: str,
                     path: Path) -> list[SettingChange] | None:
    """How ``part``'s settings of ``cfg`` differ from those recorded with digest ``recorded_digest``,
    read from the configuration saved in ``path`` (``EXPDIR/config.json``, a cycle's ``settings.json``);
    None when that file does not hold them (missing, unreadable, or of other settings than the digest)."""
    try:
        data = read_json(path)
        if data is None:
            return None
        old = experiment_from_json(data, file=str(path)).digest_parts()[part]
    except (EnkflowError, OSError, ValueError):
        return None  # the refusal still stands; it only cannot say more
    if digest_of(old) != recorded_digest:
        return None
    return changed_settings(_by_section(part, old), _by_section(part, cfg.digest_parts()[part]))


def describe(changes: list[SettingChange] | None) -> str:
    """``changes`` for an error message: ``: a.b: 1 -> 2; c: ...``, or nothing when unknown."""
    if not changes:
        return ""
    return ": " + "; ".join(map(str, changes))
