"""The reports of an experiment (``enkflow report``)."""

from enkflow.report.html import write_html
from enkflow.report.timing import Report, find_expdir, load_report, render_report, report_json

__all__ = ["Report", "find_expdir", "load_report", "render_report", "report_json", "write_html"]
