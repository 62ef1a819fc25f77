#!/usr/bin/env bash
# Build the container image from ./Dockerfile with buildah (no Docker engine, no image registry
# needed) and smoke-test the result:
#   1. a Debian 12 base made by debootstrap from the apt mirror, cached per day (UTC) as
#      .tools/image-base/bookworm-minbase-YYYYMMDD.tar and the buildah image
#      localhost/gpu-exporter-base:bookworm-YYYYMMDD (older days are pruned);
#   2. buildah bud --build-arg BASE=<that image> -t "$IMAGE" . (the builder stage installs the
#      wheel's dependencies from PyPI);
#   3. buildah run: `gpu-exporter --version`, `gpu-exporter rules export`, /runbook, and
#      `gpu-exporter serve --simulate mixed` answering /readyz and /metrics as UID 65532 (and
#      `gpu-exporter probe .../readyz`, the chart's `helm test`, exiting 0), then
#      stopping cleanly on SIGTERM. The image has no shell and no curl, so the probe is a Python
#      snippet run by the image's own interpreter inside the same `buildah run`.
# Takes about 1-2 minutes from a cold cache (see the timings it prints); `.ci/run` runs it after
# the test suite on every CI run.
# Needs root and buildah + debootstrap (installed with apt-get when missing).
# Environment: IMAGE (default localhost/gpu-exporter:dev), BASE_DATE (default today, UTC),
# SMOKE_PORT (default 19449), KEEP_IMAGE=0 to remove the built image afterwards.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-localhost/gpu-exporter:dev}"
BASE_DATE="${BASE_DATE:-$(date -u +%Y%m%d)}"
SMOKE_PORT="${SMOKE_PORT:-19449}"
KEEP_IMAGE="${KEEP_IMAGE:-1}"
BASE_IMAGE="localhost/gpu-exporter-base:bookworm-$BASE_DATE"
CACHE="$ROOT/.tools/image-base"
# vfs + chroot: works as root in an unprivileged container without overlayfs or user namespaces.
# (buildah 1.28 ignores $STORAGE_DRIVER when /etc/containers/storage.conf names a driver, so the
# driver is a flag; STORAGE_DRIVER=overlay is faster where overlayfs works.)
BUILDAH=(buildah --storage-driver "${STORAGE_DRIVER:-vfs}")
export BUILDAH_ISOLATION=chroot

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
started=$(date +%s.%N)
step_start=$started
step() {  # print the time the previous step took, then announce the next one
  local now
  now=$(date +%s.%N)
  [ -n "${step_name:-}" ] && printf '  %-40s %6.1f s\n' "$step_name" "$(echo "$now - $step_start" | bc)"
  step_name="$1"
  step_start=$now
}

need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v bc >/dev/null 2>&1 || need+=(bc)
if [ "${#need[@]}" -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "build-image: run as root (buildah with vfs storage and chroot isolation)" >&2
  exit 1
fi

echo "build-image: $IMAGE from $BASE_IMAGE"
step "base image"
if ! "${BUILDAH[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  tarball="$CACHE/bookworm-minbase-$BASE_DATE.tar"
  if [ ! -f "$tarball" ]; then
    mirror="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null ||
      true)"
    mirror="${mirror:-http://deb.debian.org/debian}"
    rootfs="$(mktemp -d)"
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    mkdir -p "$CACHE"
    rm -f "$CACHE"/bookworm-minbase-*.tar
    tar -C "$rootfs" --numeric-owner -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$rootfs"
    trap - EXIT
  fi
  ctr="$("${BUILDAH[@]}" from scratch)"
  "${BUILDAH[@]}" add --quiet "$ctr" "$tarball" / >/dev/null
  "${BUILDAH[@]}" config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
  # Older days' bases: keep the cache to one.
  "${BUILDAH[@]}" images --noheading --format '{{.Name}}:{{.Tag}}' |
    grep '^localhost/gpu-exporter-base:bookworm-' | grep -v ":bookworm-$BASE_DATE\$" |
    xargs -r "${BUILDAH[@]}" rmi >/dev/null 2>&1 || true
fi

step "buildah bud"
previous="$("${BUILDAH[@]}" images --noheading --format '{{.ID}}' "$IMAGE" 2>/dev/null | head -n1 || true)"
# A host behind a TLS-intercepting proxy gives pip a CA bundle (PIP_CERT or pip's `cert`
# setting); hand the same bundle to pip inside the build, as a build-time mount only (it does
# not end up in the image).
build_mounts=()
host_cert="${PIP_CERT:-}"
venv="${GPU_EXPORTER_DEV_VENV:-$ROOT/.venv}"
if [ -z "$host_cert" ] && [ -x "$venv/bin/pip" ]; then
  host_cert="$("$venv/bin/pip" config get global.cert 2>/dev/null || true)"
fi
if [ -n "$host_cert" ] && [ -f "$host_cert" ]; then
  pip_dir="$(mktemp -d)"
  cp "$host_cert" "$pip_dir/ca.crt"
  printf '[global]\ncert = /etc/pip-build-ca.crt\n' >"$pip_dir/pip.conf"
  build_mounts+=(--volume "$pip_dir/pip.conf:/etc/pip.conf:ro"
    --volume "$pip_dir/ca.crt:/etc/pip-build-ca.crt:ro")
  trap 'rm -rf "$pip_dir"' EXIT
fi
"${BUILDAH[@]}" bud --quiet --isolation chroot --layers=false "${build_mounts[@]}" --build-arg "BASE=$BASE_IMAGE" \
  --build-arg "VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml")" \
  --build-arg "REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" \
  --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -f "$ROOT/Dockerfile" -t "$IMAGE" "$ROOT" >/dev/null
# The previous build of the same tag is left untagged: remove it (if nothing else uses it).
if [ -n "$previous" ] && [ "$previous" != "$("${BUILDAH[@]}" images --noheading --format '{{.ID}}' "$IMAGE" | head -n1)" ]; then
  "${BUILDAH[@]}" rmi "$previous" >/dev/null 2>&1 || true
fi

[ -n "${pip_dir:-}" ] && rm -rf "$pip_dir"

step "smoke test"
ctr="$("${BUILDAH[@]}" from --quiet "$IMAGE")"
trap '"${BUILDAH[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
run() { "${BUILDAH[@]}" run --isolation chroot "$ctr" -- "$@"; }
version="$(run gpu-exporter --version)"
echo "  $version"
run gpu-exporter rules export --runbook-base-url http://gpu-exporter.gpu-exporter.svc:9449/runbook |
  grep -q '^kind: PrometheusRule$'
# shellcheck disable=SC2016  # the snippet is Python, not shell
run python3 -c '
import os, subprocess, sys, time, urllib.request
port = sys.argv[1]
assert os.getuid() == 65532 and os.getgid() == 65532, (os.getuid(), os.getgid())
base = f"http://127.0.0.1:{port}"
t0 = time.monotonic()
proc = subprocess.Popen(
    ["gpu-exporter", "serve", "--simulate", "mixed", "--listen-address", f"127.0.0.1:{port}"]
)
try:
    while True:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None:
            sys.exit(f"serve exited with status {proc.returncode} before /readyz answered 200")
        if time.monotonic() - t0 > 60:
            sys.exit("/readyz did not answer 200 within 60 s")
        time.sleep(0.1)
    ready = time.monotonic() - t0
    with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
        body = answer.read().decode()
    with urllib.request.urlopen(base + "/healthz", timeout=5) as answer:
        assert answer.status == 200
    # The runbook every alert links (docs/runbook.md, inside the wheel).
    with urllib.request.urlopen(base + "/runbook", timeout=5) as answer:
        assert answer.status == 200 and "id=\"gpulost\"" in answer.read().decode()
    assert "\ngpu_up{" in body and "gpu_exporter_build_info{" in body, body[:500]
    # What the `helm test` pod of the chart runs in this image (no shell, wget or curl here).
    probe = subprocess.run(
        ["gpu-exporter", "probe", base + "/readyz"], capture_output=True, text=True, timeout=30
    )
    assert probe.returncode == 0, f"gpu-exporter probe: {probe.returncode} {probe.stderr}"
finally:
    proc.terminate()
    status = proc.wait(30)
series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
print(f"  serve --simulate: /readyz 200 after {ready:.1f} s, {series} series")
# README: exit status 0 after a clean stop on SIGTERM.
assert status == 0, f"serve exited with status {status} after SIGTERM, not 0"
print("  serve --simulate: clean stop on SIGTERM")
' "$SMOKE_PORT"
"${BUILDAH[@]}" rm "$ctr" >/dev/null
trap - EXIT
step ""

size="$("${BUILDAH[@]}" images --noheading --format '{{.Size}}' "$IMAGE" | head -n1)"
printf 'build-image: %s (%s) OK in %.0f s\n' "$IMAGE" "$size" "$(echo "$(date +%s.%N) - $started" | bc)"
if [ "$KEEP_IMAGE" = 0 ]; then
  "${BUILDAH[@]}" rmi "$IMAGE" >/dev/null
fi
