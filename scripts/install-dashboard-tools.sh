#!/usr/bin/env bash
# Install what tests/test_dashboards.py type-checks the Grafana dashboards with: TypeScript and
# Grafana's published dashboard types (@grafana/schema), pinned, into .tools/node/ (gitignored).
# Needs node and npm (Debian: apt-get install nodejs npm). Idempotent: does nothing when the
# pinned versions are already there, so a set-up machine works offline.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.tools/node"
GRAFANA_SCHEMA_VERSION="13.2.3"
TYPESCRIPT_VERSION="7.0.2"
STAMP="$DEST/.installed-schema-$GRAFANA_SCHEMA_VERSION-ts-$TYPESCRIPT_VERSION"

if [ -f "$STAMP" ] && [ -x "$DEST/node_modules/.bin/tsc" ]; then
  exit 0
fi
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install-dashboard-tools: $tool is missing (Debian: apt-get install nodejs npm)" >&2
    exit 1
  fi
done
mkdir -p "$DEST"
cat >"$DEST/package.json" <<JSON
{
  "name": "gpu-exporter-dashboard-tools",
  "private": true,
  "description": "Type-checks dashboards/*.json against @grafana/schema (tests/test_dashboards.py)",
  "devDependencies": {
    "@grafana/schema": "$GRAFANA_SCHEMA_VERSION",
    "typescript": "$TYPESCRIPT_VERSION"
  }
}
JSON
rm -f "$DEST"/.installed-*
(cd "$DEST" && npm install --silent --no-audit --no-fund >/dev/null)
"$DEST/node_modules/.bin/tsc" --version
touch "$STAMP"
