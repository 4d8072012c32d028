import sys

from enkflow.cli import main

sys.exit(main())
