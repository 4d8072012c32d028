"""Where the MPI launcher is: the one on ``PATH``, else the one beside this Python (the `mpich` wheel).

A virtual environment used without being activated (``.venv/bin/enkflow run``) has the wheel's
``mpiexec`` beside its ``python`` but not on ``PATH``; jobs started from it would not find it.
"""

from __future__ import annotations

import os
import shutil
import sys


def find_program(name: str = "mpiexec") -> str | None:
    """The absolute path of ``name`` (a bare program name) on ``PATH`` or beside ``sys.executable``;
    ``name`` itself when it has a directory part; None when there is none."""
    if os.sep in name:
        return name
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
