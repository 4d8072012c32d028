"""``python -m enkflow.jobs CYCLE_DIR [options]``: a pilot worker, as launchers start it.

Lighter than the full ``enkflow`` command line, and needs nothing on PATH.
"""

import sys

from enkflow.jobs.worker import main

sys.exit(main())
