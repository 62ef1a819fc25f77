# Shared by run-simulated.sh and test.sh: create .venv with Python >= 3.11 and install the
# project into it. Sourced, not executed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GPU_EXPORTER_DEV_VENV:-$ROOT/.venv}"

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

pick_python() {
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "gpu-exporter needs Python 3.11 or newer (apt-get install python3)" >&2
  return 1
}

ensure_venv() {  # $1: pip extras, e.g. "[test]"
  local extras="${1:-}" python
  if [ ! -x "$VENV/bin/python" ]; then
    python="$(pick_python)"
    if ! "$python" -m venv "$VENV" 2>/dev/null; then
      # Debian/Ubuntu split venv out of the interpreter package.
      as_root apt-get update -qq
      as_root apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
      rm -rf "$VENV"
      "$python" -m venv "$VENV"
    fi
  fi
  # Reinstall only when the dependencies changed, so a set-up machine works offline.
  local stamp="$VENV/.installed-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)${extras//[^a-z]/}"
  if [ ! -f "$stamp" ]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT$extras"
    touch "$stamp"
  fi
}
