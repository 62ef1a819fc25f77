"""Command line: `gpu-exporter serve`, `gpu-exporter --version`.

Exit status: 0 after a clean stop, 1 when there is nothing to monitor (no driver), 2 for bad
input (flags, config file, scenario file).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from gpu_exporter import __version__

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2

log = logging.getLogger("gpu_exporter")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-exporter",
        description="GPU telemetry exporter and alerting daemon.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="sample GPUs and serve /metrics")
    serve.add_argument("--config", metavar="FILE", help="YAML configuration file")
    serve.add_argument(
        "--listen-address", metavar="HOST:PORT", help="where to serve HTTP (default 0.0.0.0:9449)"
    )
    serve.add_argument(
        "--interval", type=float, metavar="SECONDS", help="sampling interval (default 1)"
    )
    serve.add_argument(
        "--simulate",
        nargs="?",
        const="mixed",
        metavar="SCENARIO",
        help="run on a simulated GPU node: a built-in scenario name (default mixed) or a file",
    )
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    return parser


def _given_flags(args: argparse.Namespace) -> dict[str, Any]:
    flags = {
        "listen_address": args.listen_address,
        "interval_seconds": args.interval,
        "simulate": args.simulate,
        "log_level": args.log_level,
    }
    return {key: value for key, value in flags.items() if value is not None}


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gpu_exporter.api import create_app
    from gpu_exporter.config import ConfigError, load_config, split_host_port
    from gpu_exporter.sampler import Sampler
    from gpu_exporter.sources.base import ErrorLog, SourceUnavailableError
    from gpu_exporter.sources.nvml import NvmlSource

    try:
        config = load_config(args.config, _given_flags(args))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    simulator = None
    if config.simulate:
        from gpu_exporter import sim

        try:
            simulator = sim.install(sim.load_scenario(config.simulate))
        except ValueError as exc:  # ScenarioError and YAML errors name the file and field
            print(f"scenario error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        log.info("simulating scenario %r", config.simulate)
    errors = ErrorLog()
    source = NvmlSource(settings=config.nvml.settings(config.interval_seconds), errors=errors)
    try:
        source.start()
    except SourceUnavailableError as exc:
        print(exc, file=sys.stderr)
        return EXIT_UNAVAILABLE
    host, port = split_host_port(config.listen_address)
    problem = _cannot_listen(host, port)
    if problem:
        print(f"cannot listen on {config.listen_address}: {problem}", file=sys.stderr)
        source.close()
        return EXIT_USAGE
    sampler = Sampler(source, errors, interval=config.interval_seconds)
    try:
        sampler.start()
        # Ready once NVML started, even while a re-init is under way: an unready pod drops out
        # of the Service exactly when Prometheus should be seeing gpu_up 0.
        app = create_app(sampler, lambda: source.started)
        server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level=config.log_level, access_log=False)
        )
        server.run()
    finally:
        sampler.stop()
        source.close()
        if simulator is not None:
            sim.uninstall()
    return 0


def _cannot_listen(host: str, port: int) -> str:
    """Why binding HOST:PORT fails (checked before starting, so the error is ours to word)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return exc.strerror or str(exc)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
