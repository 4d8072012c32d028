"""Which experiment directory ``enkflow report PATH`` reads: the one holding the event log."""

from __future__ import annotations

import tomllib
from pathlib import Path

from enkflow.errors import EnkflowError
from enkflow.experiment.directory import EVENTS, ExperimentDir


def _toml_expdirs(tomls: list[Path]) -> list[Path]:
    """Experiment directories named by experiment TOML files (their ``[experiment] directory``)."""
    out = []
    for toml in tomls:
        try:
            data = tomllib.loads(toml.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue  # not an experiment file; the subdirectory scan may still find the run
        exp = data.get("experiment")
        if isinstance(exp, dict):
            # The default and the resolution of enkflow.experiment.config: relative to the TOML's directory.
            sub = Path(str(exp.get("directory", "experiment"))).expanduser()
            out.append(sub if sub.is_absolute() else toml.parent / sub)
    return out


def find_expdir(path: str | Path) -> Path:
    """The experiment directory (holding ``events.jsonl``) that ``path`` means.

    ``path`` is the experiment directory itself, an experiment TOML, or a directory
    above the experiment directory, such as the one ``enkflow demo`` names (it holds
    ``experiment.toml`` and the run directory ``run/``). Raises :class:`EnkflowError`
    naming ``path`` and the directories found, where none or several hold a run.
    """
    p = Path(path)
    if ExperimentDir(p).events.is_file():
        return p
    if p.is_file() and p.suffix == ".toml":
        named = _toml_expdirs([p])
        found = [q for q in named if ExperimentDir(q).events.is_file()]
    elif p.is_dir():
        named = _toml_expdirs(sorted(p.glob("*.toml")))
        found = [q for q in named if ExperimentDir(q).events.is_file()]
        found += [q.parent for q in sorted(p.glob(f"*/{EVENTS}"))]
    else:
        raise EnkflowError(f"{p}: no such experiment directory or file")
    found = list(dict.fromkeys(q.resolve() for q in found))
    if len(found) == 1:
        return found[0]
    if found:
        raise EnkflowError(f"{p}: not an experiment directory, but {len(found)} are below it; "
                           f"give one of: {', '.join(str(q) for q in found)}")
    hint = ""
    if named:
        hint = (f" Its experiment TOML names the experiment directory {', '.join(str(q.resolve()) for q in named)},"
                f" which has no {EVENTS} yet (has `enkflow run` started?)")
    raise EnkflowError(f"{p}: no {EVENTS}; is it an enkflow experiment directory?{hint}")

