#!/usr/bin/env bash
# What can be checked of the linux/arm64 image without an arm64 machine, an emulator or a
# container engine (the release workflow builds it under QEMU: .github/workflows/release.yml):
#   1. Debian: the packages the Dockerfile's builder installs with apt-get resolve, with every
#      dependency, for arm64 in bookworm. apt itself resolves them, against the arm64 Packages
#      indexes of this machine's Debian mirror (/etc/apt/sources.list.d/debian.sources), in a
#      throw-away apt state directory with an empty dpkg status: this machine's apt and dpkg
#      configuration is not touched.
#   2. PyPI: every dependency of the wheel (pyproject.toml [project.dependencies]) has a binary
#      for CPython 3.11 on aarch64 glibc 2.36 (Debian 12's), as the builder's `pip install`
#      needs (it has no compiler), and resolves to the same versions as on x86_64, so both
#      images run the same code. `pip install --dry-run --only-binary=:all: --platform ...`
#      reads the wheels' metadata; nothing is installed.
# Not checked here: that the build runs (the Dockerfile's steps are architecture-neutral: the
# library directory comes from Python's MULTIARCH, the loader path from ldd).
#   scripts/check-arm64.sh          (about 15-30 s; needs the Debian mirror and PyPI)
# Environment: DOCKERFILE (default ./Dockerfile), GPU_EXPORTER_DEV_VENV (the pip used).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKERFILE="${DOCKERFILE:-$ROOT/Dockerfile}"
VENV="${GPU_EXPORTER_DEV_VENV:-$ROOT/.venv}"
PYTHON="$VENV/bin/python"
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
GLIBC_MINOR=36  # Debian 12 "bookworm": glibc 2.36
started=$(date +%s)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. Debian packages ----------------------------------------------------------------------
# The builder's `apt-get install -y --no-install-recommends PACKAGE...` (the first one: the
# DCGM step's installs local .deb files).
packages="$(sed -n 's/.*apt-get install -y --no-install-recommends \([a-z0-9][a-z0-9 .+-]*\).*/\1/p' \
  "$DOCKERFILE" | head -n1 | xargs)"
if [ -z "$packages" ]; then
  echo "check-arm64: no 'apt-get install -y --no-install-recommends PACKAGES' in $DOCKERFILE" >&2
  exit 1
fi
mkdir -p "$work/sources" "$work/state/lists/partial" "$work/cache/archives/partial"
sources=(/etc/apt/sources.list.d/*.sources /etc/apt/sources.list)
for file in "${sources[@]}"; do
  [ -f "$file" ] && cp "$file" "$work/sources/"
done
if [ -f "$work/sources/sources.list" ]; then
  mv "$work/sources/sources.list" "$work/sources/system.list"
fi
touch "$work/status"
apt_arm64=(
  -o APT::Architecture=arm64 -o APT::Architectures=arm64
  -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/sources"
  -o "Dir::State=$work/state" -o "Dir::State::status=$work/status" -o "Dir::Cache=$work/cache"
  -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)"
)
if ! apt-get "${apt_arm64[@]}" -qq update >"$work/apt-update.log" 2>&1; then
  cat "$work/apt-update.log" >&2
  echo "check-arm64: apt-get update of the arm64 indexes failed" >&2
  exit 1
fi
# shellcheck disable=SC2086  # the package list is words
if ! apt-get "${apt_arm64[@]}" install -s --no-install-recommends $packages \
  >"$work/apt-install.log" 2>&1; then
  grep -E '^(E:| )' "$work/apt-install.log" >&2 || cat "$work/apt-install.log" >&2
  echo "check-arm64: Debian bookworm cannot install '$packages' on arm64" >&2
  exit 1
fi
wrong="$(grep '^Inst ' "$work/apt-install.log" | grep -Ev '\[(arm64|all)\]' || true)"
if [ -n "$wrong" ]; then
  echo "check-arm64: packages not built for arm64:" >&2
  echo "$wrong" >&2
  exit 1
fi
count="$(grep -c '^Inst ' "$work/apt-install.log")"
echo "check-arm64: Debian bookworm arm64: $packages -> $count packages, all [arm64] or [all]"

# 2. Python dependencies --------------------------------------------------------------------
"$PYTHON" - "$ROOT/pyproject.toml" >"$work/requirements.txt" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
[ -s "$work/requirements.txt" ] || { echo "check-arm64: no dependencies in pyproject.toml" >&2; exit 1; }
resolve() {  # ARCH: pip's report of the wheels it would install on ARCH
  local arch="$1" platforms=() minor
  for ((minor = 17; minor <= GLIBC_MINOR; minor++)); do
    platforms+=(--platform "manylinux_2_${minor}_$arch")
  done
  platforms+=(--platform "manylinux2014_$arch")
  if ! "$PYTHON" -m pip install --quiet --disable-pip-version-check --dry-run --ignore-installed \
    --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 "${platforms[@]}" \
    --report "$work/report-$arch.json" -r "$work/requirements.txt" >"$work/pip-$arch.log" 2>&1; then
    grep -v '^WARNING: Location' "$work/pip-$arch.log" >&2
    echo "check-arm64: the wheel's dependencies have no binaries for CPython 3.11 on $arch" >&2
    exit 1
  fi
}
resolve aarch64
resolve x86_64
"$PYTHON" - "$work/report-aarch64.json" "$work/report-x86_64.json" <<'PY'
import json, sys

def wheels(path):
    with open(path) as f:
        install = json.load(f)["install"]
    return {
        item["metadata"]["name"].lower(): (
            item["metadata"]["version"],
            item["download_info"]["url"].rsplit("/", 1)[-1],
        )
        for item in install
    }

arm, x86 = wheels(sys.argv[1]), wheels(sys.argv[2])
differ = sorted(name for name in arm.keys() | x86.keys() if arm.get(name, ("-",))[0] != x86.get(name, ("-",))[0])
if differ:
    for name in differ:
        print(f"check-arm64: {name}: aarch64 {arm.get(name, ('none',))[0]}, x86_64 {x86.get(name, ('none',))[0]}", file=sys.stderr)
    sys.exit("check-arm64: aarch64 and x86_64 would install different versions")
native = sorted(f"{name} {version} ({wheel})" for name, (version, wheel) in arm.items() if "aarch64" in wheel)
print(f"check-arm64: PyPI cp311 aarch64: {len(arm)} wheels, the same versions as x86_64; with native code:")
for line in native:
    print(f"  {line}")
PY
echo "check-arm64: OK in $(($(date +%s) - started)) s"
