"""What `serve` imports: optional clients stay unloaded unless their feature is configured.

httpx (the Alertmanager client, with pygments and httpcore: about 2 MiB) and h2 with
protobuf (pod attribution's gRPC client: about 4 MiB) would otherwise sit in every daemon's
memory; grpcio (about 10 MiB more) is the simulator's server only, never the daemon's; nor
are the other commands' modules loaded (`diagnose` and its report: about 1 MiB). Each
case runs `gpu-exporter serve` in a fresh interpreter up to the point where uvicorn would
serve (its config loaded, so its lazy imports happen too), then lists what is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon import free_port

# Runs `serve` with uvicorn.Server.run replaced: load what uvicorn would load, report, return.
_SCRIPT = """
import json, sys
import uvicorn

def run(self, sockets=None):
    self.config.load()
    print(json.dumps(sorted(sys.modules)))

uvicorn.Server.run = run
from gpu_exporter import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def loaded_modules(tmp_path: Path, *flags: str, **environ: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env.pop("NODE_NAME", None)
    env["GPU_EXPORTER_KUBERNETES__ENABLED"] = "false"  # "auto" depends on this machine
    env.update(environ)
    args = ["serve", "--simulate", "mixed", "--listen-address", f"127.0.0.1:{free_port()}"]
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *args, *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    modules: set[str] = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert (
        "gpu_exporter.pipeline.assembly" in modules and "uvicorn.protocols.http.h11_impl" in modules
    )
    return modules


def packages(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def test_default_serve_imports_neither_httpx_nor_grpc(tmp_path: Path) -> None:
    loaded = packages(loaded_modules(tmp_path))
    assert not loaded & {"httpx", "httpcore", "pygments", "grpc", "google", "h2"}, sorted(loaded)


def test_serve_loads_no_other_commands_module(tmp_path: Path) -> None:
    loaded = loaded_modules(tmp_path)
    others = {"gpu_exporter.diagnose", "gpu_exporter.config.check", "gpu_exporter.web.probe"}
    assert not loaded & others, sorted(loaded & others)
    assert "gpu_exporter.cli" in loaded


def test_each_command_parses_as_in_the_whole_command_line() -> None:
    """`main` builds only the command it runs: each parses its arguments as the whole parser
    (help, the README's synopsis) does."""
    from gpu_exporter import cli

    examples = {
        "serve": ["serve", "--simulate", "--interval", "2"],
        "rules": ["rules", "check", "a.yaml"],
        "config": ["config", "check", "c.yaml"],
        "diagnose": ["diagnose", "--duration", "3"],
        "probe": ["probe", "http://127.0.0.1:1/readyz"],
    }
    assert set(examples) == set(cli.COMMANDS)
    whole = cli.build_parser()
    for command, argv in examples.items():
        assert cli.build_parser(command).parse_args(argv) == whole.parse_args(argv)


def test_re2_is_loaded_only_for_a_matcher_that_needs_it(tmp_path: Path) -> None:
    # The shipped rules' matchers are literal alternatives (`a|b`) or `.*text.*`: no RE2
    # (its C++ library is about 2.6 MiB resident).
    assert "re2" not in packages(loaded_modules(tmp_path))
    rules = tmp_path / "regex.rules.yaml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: A\n"
        '    expr: gpu_up{uuid=~"GPU-[0-9a-f-]+"} == 0\n'
    )
    assert "re2" in packages(loaded_modules(tmp_path, "--rules", str(rules)))


@pytest.mark.parametrize(
    ("flags", "environ", "package"),
    [
        (("--alertmanager-url", "http://127.0.0.1:9"), {}, "httpx"),
        (
            (),
            {
                "GPU_EXPORTER_KUBERNETES__ENABLED": "true",
                "GPU_EXPORTER_KUBERNETES__SOCKET_PATH": "x.sock",
                "GPU_EXPORTER_KUBERNETES__TIMEOUT_SECONDS": "0.5",
            },
            "h2",
        ),
    ],
    ids=["alertmanager", "attribution"],
)
def test_the_feature_that_needs_a_client_imports_it(
    tmp_path: Path, flags: tuple[str, ...], environ: dict[str, str], package: str
) -> None:
    """The control for the test above: the harness does see these imports when they happen."""
    assert package in packages(loaded_modules(tmp_path, *flags, **environ))


def test_attribution_loads_no_grpcio(tmp_path: Path) -> None:
    loaded = packages(
        loaded_modules(
            tmp_path,
            GPU_EXPORTER_KUBERNETES__ENABLED="true",
            GPU_EXPORTER_KUBERNETES__SOCKET_PATH="x.sock",
            GPU_EXPORTER_KUBERNETES__TIMEOUT_SECONDS="0.5",
        )
    )
    assert "gpu_exporter" in loaded and "h2" in loaded
    assert not loaded & {"grpc", "_grpc"}, sorted(loaded & {"grpc", "_grpc"})
