"""`python -m clusterctl.autostop supervise NAME`: the local provider's host-side supervisor. The argv is how
running supervisors are found (autostop.settings.supervisors), so it stays the same across versions."""

import sys

from clusterctl.autostop.settings import main

sys.exit(main(sys.argv[1:]))
