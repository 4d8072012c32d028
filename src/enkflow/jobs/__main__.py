"""``python -m enkflow.jobs CYCLE_DIR | --board FILE [options]``: a pilot, as launchers start it.

Lighter than the full ``enkflow`` command line, and needs nothing on PATH.
"""

import sys

from enkflow.jobs.entry import main

sys.exit(main())
