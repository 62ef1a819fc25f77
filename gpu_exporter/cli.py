"""Command line: `gpu-exporter serve`, `gpu-exporter --version`; `rules`, `config check`,
`diagnose` and `probe` are registered here and live in their own modules.

Exit status: 0 after a clean stop, 1 when there is nothing to monitor (no driver), 2 for bad
input (flags, config file, scenario file, rule files, web-config file, more GPUs than
nvml.max_devices).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpu_exporter import __version__
from gpu_exporter.alerting.settings import DEFAULT_RULE_SEMANTICS, RULE_SEMANTICS
from gpu_exporter.collect.settings import DEFAULT_INTERVAL_SECONDS, add_dcgm_arguments
from gpu_exporter.model.profile import PROFILES
from gpu_exporter.web.settings import DEFAULT_LISTEN_ADDRESS

if TYPE_CHECKING:  # imported by `serve` only: `--version` and `rules` stay light
    from gpu_exporter.collect.nvml.source import NvmlSource
    from gpu_exporter.collect.source import ErrorLog
    from gpu_exporter.config.load import Config

EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2
# How long `serve` waits for the first NVML init before serving anyway: an init that fails
# within it (no driver, no library) is the exit status; a slower one is waited for while
# /healthz answers. Short, so that the port opens within a second of the start.
INIT_GRACE_SECONDS = 0.25

log = logging.getLogger("gpu_exporter")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; with `only`, that command's parser alone (`main` for a known command:
    the other commands' parsers import their modules, which `serve` would then hold for good)."""
    parser = argparse.ArgumentParser(
        prog="gpu-exporter",
        description="GPU telemetry exporter and alerting daemon.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, add_parser in _PARSERS.items():
        if only in (None, name):
            add_parser(commands)
    return parser


def _add_serve_command(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="sample GPUs and serve /metrics")
    serve.add_argument("--config", metavar="FILE", help="YAML configuration file")
    serve.add_argument(
        "--listen-address",
        metavar="HOST:PORT",
        help=f"where to serve HTTP (default {DEFAULT_LISTEN_ADDRESS})",
    )
    serve.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help=f"sampling interval (default {DEFAULT_INTERVAL_SECONDS:g})",
    )
    serve.add_argument(
        "--simulate",
        nargs="?",
        const="mixed",
        metavar="SCENARIO",
        help="run on a simulated GPU node: a built-in scenario name (default mixed) or a "
        "file's path (with a / or ending in .yaml or .yml: ./mixed is a file, mixed the built-in)",
    )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="how much to log (default info)",
    )
    serve.add_argument(
        "--rules",
        action="append",
        metavar="FILE_OR_GLOB",
        help="rule file(s) to evaluate, repeatable (default: the shipped pack)",
    )
    serve.add_argument(
        "--alertmanager-url",
        action="append",
        metavar="URL",
        help="send alerts to this Alertmanager, repeatable",
    )
    serve.add_argument(
        "--external-label",
        action="append",
        metavar="NAME=VALUE",
        help="label added to every alert sent (node defaults to $NODE_NAME), repeatable",
    )
    serve.add_argument(
        "--web-config-file",
        metavar="FILE",
        help="TLS and basic auth for every endpoint, in the exporter-toolkit web-config format",
    )
    add_dcgm_arguments(serve, None)
    serve.add_argument(
        "--metrics-profile",
        choices=PROFILES,
        help="which series /metrics exports (metrics.profile): default, what the shipped rules "
        "and dashboards read; full, every family (default: default)",
    )
    serve.add_argument(
        "--dcgm-compat",
        action="store_true",
        default=None,
        help="also serve dcgm-exporter's metric names, labels and units at /metrics/dcgm",
    )
    serve.add_argument(
        "--dcgm-compat-listen-address",
        metavar="HOST:PORT",
        help="also serve that output at /metrics here (dcgm-exporter: 0.0.0.0:9400)",
    )
    serve.add_argument(
        "--dcgm-compat-counters-file",
        metavar="FILE",
        help="serve the families of this dcgm-exporter counters file (its -f/--collectors CSV) "
        "at /metrics/dcgm, with its types and help texts",
    )


def _add_config_command(commands: argparse._SubParsersAction) -> None:
    from gpu_exporter.config import check

    check.add_parser(commands)


def _add_diagnose_command(commands: argparse._SubParsersAction) -> None:
    from gpu_exporter import diagnose

    diagnose.add_parser(commands)


def _add_probe_command(commands: argparse._SubParsersAction) -> None:
    from gpu_exporter.web import probe

    probe.add_parser(commands)


def _add_semantics_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--semantics",
        choices=RULE_SEMANTICS,
        default=DEFAULT_RULE_SEMANTICS,
        help="which Prometheus' PromQL to follow, as rules.semantics does "
        f"(default {DEFAULT_RULE_SEMANTICS}: promtool 2.42's)",
    )


def _add_rules_commands(commands: argparse._SubParsersAction) -> None:
    rules = commands.add_parser("rules", help="check, test and export rule files")
    verbs = rules.add_subparsers(dest="rules_command", metavar="VERB", required=True)
    check = verbs.add_parser(
        "check",
        help="validate rule files as `promtool check rules` does, and that the daemon can "
        "evaluate them (its PromQL, how far back a rule reads)",
    )
    check.add_argument(
        "--max-range-seconds",
        type=_positive_seconds,
        metavar="SECONDS",
        help="how far back a rule may read (default: the daemon's rules.max_range_seconds, 1h)",
    )
    check.add_argument(
        "--strict",
        action="store_true",
        help="also fail on rules the daemon would load but not evaluate (valid PromQL it does "
        "not implement, such as native-histogram functions; a warning otherwise), for CI",
    )
    _add_semantics_argument(check)
    check.add_argument("files", nargs="+", metavar="FILE", help="rule files, or globs of them")
    test = verbs.add_parser("test", help="run promtool-format rule unit tests on our evaluator")
    _add_semantics_argument(test)
    test.add_argument("files", nargs="+", metavar="FILE", help="promtool-format unit-test files")
    export = verbs.add_parser("export", help="render rule files as a Kubernetes manifest")
    export.add_argument(
        "--format",
        choices=["prometheusrule"],
        default="prometheusrule",
        help="what to render (default prometheusrule: a Prometheus Operator PrometheusRule)",
    )
    export.add_argument("--name", default="gpu-exporter", help="metadata.name")
    export.add_argument("--namespace", help="metadata.namespace")
    export.add_argument(
        "--label", action="append", metavar="NAME=VALUE", help="metadata label, repeatable"
    )
    export.add_argument(
        "--runbook-base-url",
        metavar="URL",
        help="where runbook_url links to docs/runbook.md point, e.g. the exporters' own "
        "/runbook through their Service (required when the files have such links, as the "
        "shipped pack does)",
    )
    export.add_argument("files", nargs="*", metavar="FILE", help="default: the shipped pack")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _given_flags(args: argparse.Namespace) -> dict[str, Any]:
    flags = {
        "listen_address": args.listen_address,
        "interval_seconds": args.interval,
        "simulate": args.simulate,
        "log_level": args.log_level,
        "rules.files": args.rules,
        "alerting.alertmanagers": args.alertmanager_url,
        "alerting.external_labels": ",".join(args.external_label) if args.external_label else None,
        "web_config_file": args.web_config_file,
        "dcgm.mode": args.dcgm,
        "dcgm.address": args.dcgm_address,
        "metrics.profile": args.metrics_profile,
        "dcgm_compat.enabled": args.dcgm_compat,
        "dcgm_compat.listen_address": args.dcgm_compat_listen_address,
        "dcgm_compat.counters_file": args.dcgm_compat_counters_file,
    }
    return {key: value for key, value in flags.items() if value is not None}


def serve(args: argparse.Namespace) -> int:
    # Every module serving needs, imported before anything starts (so that what follows,
    # from NVML's start to the open port, is quick).
    from gpu_exporter.collect.nvml.source import NvmlSource
    from gpu_exporter.collect.source import ErrorLog
    from gpu_exporter.config.load import ConfigError, load_config
    from gpu_exporter.web import api, http_server  # noqa: F401

    try:
        config = load_config(args.config, _given_flags(args))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # APScheduler logs every run of every job at INFO: once a second is noise, not news.
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, logging.root.level))
    simulator = kubelet = api_server = None
    if config.simulate:
        from gpu_exporter import sim

        try:
            scenario = sim.load_scenario(config.simulate)
        except ValueError as exc:  # ScenarioError and YAML errors name the file and field
            for problem in str(exc).splitlines():  # one line per problem, each on its own
                print(f"scenario error: {_set_by(config, 'simulate')}{problem}", file=sys.stderr)
            return EXIT_USAGE
        simulator = sim.install(scenario)
        log.info("simulating scenario %r", config.simulate)
        kubelet, config = _simulated_kubelet(scenario, config, simulator.clock)
        api_server, config = _simulated_api_server(scenario, config, simulator.clock)
        config = _simulated_dcgm(scenario, config)
        config = _simulated_processes(simulator, config)
    errors = ErrorLog()
    from gpu_exporter.collect import dcgm
    from gpu_exporter.collect.nvml.topology import read_topology
    from gpu_exporter.collect.source import SourceUnavailableError

    source = None
    try:
        try:
            dcgm_source = dcgm.configured(config.dcgm, errors, config.interval_seconds)
        except SourceUnavailableError as exc:  # a DCGM mode that cannot work on this host
            print(f"error: {_set_by(config, 'dcgm.mode')}{exc}", file=sys.stderr)
            return EXIT_USAGE
        source = NvmlSource(
            settings=config.nvml,
            interval_seconds=config.interval_seconds,
            errors=errors,
            topology_reader=read_topology,
            dcgm=dcgm_source,
        )
        source.begin()  # NVML starts while the rest loads
        return _serve(config, source, errors, time.monotonic() + INIT_GRACE_SECONDS)
    finally:
        if source is not None:
            source.close()
        if simulator is not None:
            sim.uninstall()
        if kubelet is not None:
            kubelet.close()
        if api_server is not None:
            api_server.close()


def _set_by(config: Config, setting: str) -> str:
    """The prefix naming the environment variable that set the setting a later error is about
    (a scenario, a rule file), as "environment variable X (setting): ": a person may not know
    that it is set there. A flag they just typed needs no naming."""
    origin = config.origin_of(setting)
    return f"{origin} ({setting}): " if origin.startswith("environment variable") else ""


def _simulated_dcgm(scenario: Any, config: Config) -> Config:
    """A scenario with a DCGM host engine (`dcgm:`) is a node whose operator runs one for the
    exporter: `dcgm.mode` is then `auto` unless it was set (elsewhere DCGM is opt-in)."""
    if scenario.dcgm is None or "mode" in config.dcgm.model_fields_set:
        return config
    log.info("simulated DCGM host engine: dcgm.mode auto (set dcgm.mode to change it)")
    dcgm = config.dcgm.model_copy(update={"mode": "auto"})
    return config.model_copy(update={"dcgm": dcgm})


def _simulated_kubelet(
    scenario: Any, config: Config, clock: Callable[[], float]
) -> tuple[Any, Config]:
    """For a scenario with `pods:`, a fake kubelet serving them (those active at `clock()`, the
    fake NVML's scenario time), and the configuration pointed at it, unless `kubernetes.enabled`
    was set: a simulated node then has pods as a real one, read by the production attribution
    path."""
    if not scenario.pods or config.kubernetes.enabled != "auto":
        return None, config
    from gpu_exporter.sim.kubelet import describe, start_for

    kubelet = start_for(scenario, clock)
    if kubelet is None:
        return None, config
    kubernetes = config.kubernetes.model_copy(
        update={"enabled": True, "socket_path": kubelet.socket_path}
    )
    # Counted as pod attribution counts what it reads ("N devices held by pods").
    log.info("simulated kubelet at %s: %s", kubelet.socket_path, describe(scenario, clock()))
    return kubelet, config.model_copy(update={"kubernetes": kubernetes})


def _simulated_api_server(
    scenario: Any, config: Config, clock: Callable[[], float]
) -> tuple[Any, Config]:
    """For a scenario with a DRA driver (`dra:`), a fake API server serving its ResourceSlices,
    and DRA attribution pointed at it (its CA, token and node), unless `kubernetes.dra.enabled`
    was set or pods are not attributed."""
    dra = config.kubernetes.dra
    if scenario.dra is None or "enabled" in dra.model_fields_set or not config.kubernetes.active():
        return None, config
    from gpu_exporter.sim.apiserver import start_for
    from gpu_exporter.web.settings import split_host_port

    # Not a port the daemon is about to listen on: a port picked free a moment ago (as tests
    # and scripts do) is free for the kernel to hand this server too.
    addresses = (config.listen_address, config.dcgm_compat.listen_address)
    daemon_ports = {split_host_port(address)[1] for address in addresses if address}
    server = start_for(scenario, clock, daemon_ports)
    if server is None:
        return None, config
    dra = dra.model_copy(
        update={
            "enabled": True,
            "api_server": server.url,
            "ca_file": str(server.ca_file),
            "token_file": str(server.token_file),
            "node_name": server.node_name,
        }
    )
    log.info("simulated API server with the node's ResourceSlices at %s", server.url)
    kubernetes = config.kubernetes.model_copy(update={"dra": dra})
    return server, config.model_copy(update={"kubernetes": kubernetes})


def _simulated_processes(simulator: Any, config: Config) -> Config:
    """A scenario with `processes:` is a node whose exporter may see the host's PIDs and the
    container runtime: per-process attribution reads the simulator's /proc and CRI runtime,
    unless `kubernetes.processes.enabled` was set."""
    proc_root = getattr(simulator, "proc_root", None)
    socket = getattr(simulator, "cri_socket_path", None)
    processes = config.kubernetes.processes
    if proc_root is None or socket is None or "enabled" in processes.model_fields_set:
        return config
    processes = processes.model_copy(
        update={"enabled": True, "proc_root": str(proc_root), "runtime_socket": str(socket)}
    )
    log.info("simulated processes: /proc at %s, container runtime at %s", proc_root, socket)
    kubernetes = config.kubernetes.model_copy(update={"processes": processes})
    nvml = config.nvml.model_copy(update={"processes": True})
    return config.model_copy(update={"kubernetes": kubernetes, "nvml": nvml})


def _serve(config: Config, source: NvmlSource, errors: ErrorLog, grace_ends: float) -> int:
    """Serve HTTP from the first second, whatever NVML does: NVML starts on its own thread
    (`NvmlSource.begin`) while the rules load; an init that fails at once is the exit status
    (1, or 2 for more GPUs than nvml.max_devices), one still running after
    `INIT_GRACE_SECONDS` is waited for (and later failures retried) while /readyz says why."""
    from gpu_exporter.collect.source import TooManyDevicesError
    from gpu_exporter.pipeline.assembly import assemble
    from gpu_exporter.web import http_server
    from gpu_exporter.web.api import create_app, create_compat_app
    from gpu_exporter.web.dcgm_compat.selection import CountersFileError
    from gpu_exporter.web.settings import split_host_port
    from gpu_exporter.web.web_config import WebConfigError

    host, port = split_host_port(config.listen_address)
    for address in (config.listen_address, config.dcgm_compat.listen_address):
        problem = http_server.cannot_listen(*split_host_port(address)) if address else ""
        if problem:
            print(f"cannot listen on {address}: {problem}", file=sys.stderr)
            return EXIT_USAGE
    problem = http_server.web_config_problem(config.web_config_file)
    if problem:
        print(f"web config error: {_set_by(config, 'web_config_file')}{problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        assembly = assemble(config, source, errors)
    except CountersFileError as exc:  # each problem names the file and line
        for problem in exc.problems:
            print(f"counters file error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:  # RuleFileError, bad Alertmanager settings
        from gpu_exporter.alerting.rules.loader import RuleFileError

        named = _set_by(config, "rules.files") if isinstance(exc, RuleFileError) else ""
        print(f"rule error: {named}{exc}", file=sys.stderr)
        return EXIT_USAGE
    failure = source.progress.commit(max(0.0, grace_ends - time.monotonic()))
    if failure is not None:
        print(failure, file=sys.stderr)
        return EXIT_USAGE if isinstance(failure, TooManyDevicesError) else EXIT_UNAVAILABLE
    if assembly.rules is not None:
        log.info("loaded %d rule groups", len(assembly.rules.evaluator.groups))
    try:
        assembly.start_when(source.progress.wait_ready)
        # Ready once NVML started, even while a re-init is under way: an unready pod drops out
        # of the Service exactly when Prometheus should be seeing gpu_up 0.
        compat = assembly.dcgm_compat
        app = create_app(
            assembly.sampler, lambda: source.started, assembly.rules, source.progress, compat
        )
        also = None
        if compat is not None and config.dcgm_compat.listen_address:
            compat_host, compat_port = split_host_port(config.dcgm_compat.listen_address)
            compat_app = create_compat_app(assembly.sampler, compat, source.progress)
            also = (compat_host, compat_port, compat_app)
        http_server.run(app, host, port, config.web, config.web_config_file, config.log_level, also)
    except WebConfigError as exc:  # the web-config file changed since it was checked above
        print(f"web config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except http_server.ListenError as exc:  # taken since it was checked above
        print(f"cannot listen on {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        assembly.stop()
    return 0


# Each command's parser, in the order `--help` lists them; a command's module is imported
# only when its parser is built.
_PARSERS: dict[str, Callable[[argparse._SubParsersAction], object]] = {
    "serve": _add_serve_command,
    "rules": _add_rules_commands,
    "config": _add_config_command,
    "diagnose": _add_diagnose_command,
    "probe": _add_probe_command,
}
COMMANDS = tuple(_PARSERS)


def main(argv: Sequence[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    command = given[0] if given and given[0] in COMMANDS else None  # else: help, or a misspelling
    parser = build_parser(command)
    args = parser.parse_args(given)
    if args.command == "serve":
        return serve(args)
    if args.command == "rules":
        from gpu_exporter.alerting.rules import commands

        return commands.run(args)
    if args.command == "config":
        from gpu_exporter.config import check as config_check

        return config_check.run(args)
    if args.command == "diagnose":
        from gpu_exporter import diagnose

        return diagnose.run(args)
    if args.command == "probe":
        from gpu_exporter.web import probe

        return probe.run(args)
    parser.print_help(sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
