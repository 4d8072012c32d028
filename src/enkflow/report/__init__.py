"""The reports of an experiment, on top of every layer: they read what a run leaves in its directory.

``enkflow report DIR`` is the time-to-solution table of the event log (:mod:`.timing`, the per-cycle
accounting; :mod:`.text`, the table and JSON; :mod:`.incidents`, the warnings; :mod:`.expdir`, which
directory is read); ``--html`` the page with figures (:mod:`.html`; :mod:`.settings`; :mod:`.scores` from the cycle
directories' files, drawn by :mod:`.score_figures`; :mod:`.maps` and :mod:`.map_grid`; :mod:`.figures`,
the drawing; :mod:`.files`).
"""

from enkflow.report.expdir import find_expdir
from enkflow.report.html import write_html
from enkflow.report.maps import MapCycles
from enkflow.report.text import render_report, report_json
from enkflow.report.timing import CycleTiming, OnlineCycleTiming, Report, load_report

__all__ = ["CycleTiming", "MapCycles", "OnlineCycleTiming", "Report", "find_expdir", "load_report", "render_report", "report_json",
           "write_html"]
