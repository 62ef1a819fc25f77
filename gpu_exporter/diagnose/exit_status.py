"""`gpu-exporter diagnose`'s exit statuses (the package docstring says when each is given)."""

EXIT_OK = 0
EXIT_ATTENTION = 1
EXIT_USAGE = 2
EXIT_NO_DRIVER = 3
