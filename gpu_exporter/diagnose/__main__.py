"""`python -m gpu_exporter.diagnose`."""

import sys

from gpu_exporter.diagnose.command import main

sys.exit(main())
