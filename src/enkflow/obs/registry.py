"""The table of observation operators: ``[observations] interpolation = NAME`` picks one.

A new operator is one module (a class with ``name``, ``read`` and ``locate``:
:class:`~enkflow.obs.locating.ObsOperator`) and one line in :data:`OPERATORS`; an operator
defined elsewhere (a plugin, a test) is added at run time with :func:`register`.
"""

from __future__ import annotations

import importlib

from enkflow.errors import ConfigError
from enkflow.obs.locating import ObsOperator

# Name -> the operator, or "module:Class" of a built-in, imported when first used (as entry points are).
OPERATORS: dict[str, str | ObsOperator] = {
    "index": "enkflow.obs.locators.index:IndexOperator",
    "nearest": "enkflow.obs.locators.nearest:NearestOperator",
    "bilinear": "enkflow.obs.locators.bilinear:BilinearOperator",
}


def register(operator: ObsOperator) -> None:
    """Add ``operator`` under its ``name`` (an operator of that name already there is an error)."""
    if operator.name in OPERATORS:
        raise ConfigError(f"an observation operator named '{operator.name}' is already registered",
                          key="observations.interpolation")
    OPERATORS[operator.name] = operator


def operator_names() -> list[str]:
    """The registered names, built-ins first."""
    return list(OPERATORS)


def get_operator(name: str) -> ObsOperator:
    """The operator registered as ``name`` (ConfigError listing the registered ones where none is)."""
    entry = OPERATORS.get(name)
    if entry is None:
        raise ConfigError(f"unknown observation operator '{name}'; registered: {', '.join(OPERATORS)}",
                          key="observations.interpolation")
    if not isinstance(entry, str):
        return entry
    module, _, cls = entry.partition(":")
    op = getattr(importlib.import_module(module), cls)()
    if not isinstance(op, ObsOperator):
        raise TypeError(f"{entry} is not an observation operator (name, read, locate)")
    return op
