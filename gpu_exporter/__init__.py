"""gpu-exporter: GPU telemetry exporter and alerting daemon."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpu-exporter")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"
