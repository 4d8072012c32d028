"""Checks run before a cycle starts, so that bad input fails early and clearly."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import netCDF4

from enkflow.errors import ConfigError, FileFormatError, StructureMismatchError
from enkflow.experiment.config import ExperimentConfig, Initial
from enkflow.experiment.verification import check_verification_files
from enkflow.io.validate import validate_files
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.reader import obs_count, parts_of
from enkflow.state import StateLayout

# The pre-flight check reads a file this many observations at a time, so its memory does not grow with the file.
PREFLIGHT_PART = 1_000_000


def check_observations(cfg: ExperimentConfig, cycles: list[int]) -> None:
    """Every cycle's observation file exists and, with the built-in analysis, passes every check
    the analysis would make of it (:func:`enkflow.obs.obsfile.load_for_state`: values, locations
    inside the domain, kinds known to ``[observations.kinds]``, times inside the window).

    Run before the first forecast: a bad file of a late cycle must not be found only after the
    forecasts of the earlier cycles have rewritten the restarts. An external analysis program
    reads the files its own way, so for it only their existence is checked. A large file is read
    PREFLIGHT_PART observations at a time (the first bad observation of each part is named by its
    index in the file).
    """
    for k in cycles:
        p = cfg.obs_path(k)
        if not p.is_file():
            raise ConfigError(f"observation file of cycle {k} not found: {p}", key="observations.file", file=None)
    builtin = cfg.analysis_task.command is None and cfg.state is not None and cfg.analysis is not None
    # Member 1's restart gives the state's layout: the experiment's copy, or before the copy is
    # made (experiment.initial = "copy") the configured one; without either, check_restarts names it.
    template = next((p for p in (cfg.restart_path(1), cfg.source_restart_path(1)) if p.is_file()), None)
    if not builtin or not cycles or template is None:
        return
    layout = StateLayout.from_config(template, cfg.state)
    check_verification_files(cfg.verification, cfg.path, cycles, layout)
    metric = cfg.analysis.localization.metric if cfg.analysis.localization else None
    settings = ObsSettings.from_experiment(cfg)
    for k in cycles:
        path = cfg.obs_path(k)
        for part in parts_of(obs_count(path, k), PREFLIGHT_PART):
            # Locations, kinds, times, and the vertical coordinate vertical localization needs.
            load_for_state(path, layout, metric, cycle=k, settings=settings, part=part)


def check_program(template: str, key: str, env_path: str | None = None) -> None:
    argv = shlex.split(template)
    if not argv:
        raise ConfigError("empty command", key=key)
    prog = argv[0]
    if "{" in prog:
        return  # the program itself is a placeholder; checked when it runs
    path = env_path if env_path is not None else os.environ.get("PATH", "")
    if os.sep in prog:
        if not (os.path.isfile(prog) and os.access(prog, os.X_OK)):
            raise ConfigError(f"program '{prog}' does not exist or is not executable (command: {template})", key=key)
    elif shutil.which(prog, path=path) is None:
        raise ConfigError(f"program '{prog}' not found on PATH (command: {template})", key=key)


def check_commands(cfg: ExperimentConfig) -> None:
    """The model, operator and analysis programs can be found."""
    path = cfg.model.env.get("PATH", os.environ.get("PATH", ""))
    check_program(cfg.model.command, "model.command", path)
    if cfg.observations.operator:
        check_program(cfg.observations.operator, "observations.operator", path)
    task = cfg.analysis_task
    if task.launcher.strip():
        check_program(task.launcher, "analysis_task.launcher")
    if task.command is not None:
        check_program(task.command, "analysis_task.command")


def _structure(path: Path) -> tuple[dict[str, int], dict[str, tuple[tuple[str, ...], str]]]:
    try:
        with netCDF4.Dataset(path, "r") as ds:
            dims = {n: len(d) for n, d in ds.dimensions.items()}
            var = {n: (tuple(v.dimensions), str(v.dtype)) for n, v in ds.variables.items()}
    except OSError as exc:
        raise FileFormatError(f"cannot open as NetCDF: {exc}", path=str(path)) from None
    return dims, var


def check_restarts(cfg: ExperimentConfig, *, source: bool = False) -> None:
    """Every member's restart exists and has member 1's dimensions and variables.

    With a ``[state]`` section the I/O layer's own check runs too (state
    variables present, same shapes, types and storage layout, writable).
    ``source`` checks the configured initial restarts instead of the ones
    cycled (they differ with ``experiment.initial = "copy"``).
    """
    where = cfg.source_restart_path if source else cfg.restart_path
    ref_path = where(1)
    paths = [where(m) for m in range(1, cfg.experiment.members + 1)]
    for m, p in enumerate(paths, start=1):
        if not p.is_file():
            raise FileFormatError(f"restart file of member {m} not found (experiment.restart)", path=str(p))
    if cfg.state is not None:
        writable = not (source and cfg.experiment.initial is Initial.COPY)
        validate_files([str(p) for p in paths], StateLayout.from_config(ref_path, cfg.state), writable=writable)
    ref_dims, ref_vars = _structure(ref_path)
    for p in paths[1:]:
        dims, var = _structure(p)
        for name, size in ref_dims.items():
            if dims.get(name) != size:
                raise StructureMismatchError(f"dimension '{name}' has size {dims.get(name)}, but {size} in {ref_path}",
                                             path=str(p))
        for name in sorted(set(ref_vars) | set(var)):
            if name not in var:
                raise StructureMismatchError(f"variable missing (present in {ref_path})", path=str(p), variable=name)
            if name not in ref_vars:
                raise StructureMismatchError(f"variable not in {ref_path}", path=str(p), variable=name)
            if var[name] != ref_vars[name]:
                raise StructureMismatchError(f"dimensions/type {var[name]} differ from {ref_vars[name]} in {ref_path}",
                                             path=str(p), variable=name)
