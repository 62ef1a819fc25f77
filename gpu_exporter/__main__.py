"""`python -m gpu_exporter` is the same as the `gpu-exporter` command."""

import sys

from gpu_exporter.cli import main

sys.exit(main())
