#!/usr/bin/env bash
# The release workflow's first step (.github/workflows/release.yml): the pushed tag must be
# v<version>, where <version> is the chart's version and appVersion (helm/gpu-exporter/Chart.yaml)
# and the package's version (pyproject.toml), so that the image tag, the chart's default image
# and `gpu-exporter --version` all say the same.
#   scripts/release-version.sh v0.1.0
# Prints `version=0.1.0` and `created=<HEAD's commit time, RFC 3339>` (for $GITHUB_OUTPUT);
# exits 1 naming each file and field that disagrees with the tag.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tag="${1:?usage: release-version.sh TAG}"
if ! [[ "$tag" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "release-version: tag '$tag' is not vMAJOR.MINOR.PATCH" >&2
  exit 1
fi
version="${tag#v}"

field() {  # FILE PATTERN: the first value a `sed -n s/PATTERN/\1/p` finds
  sed -n "s/$2/\\1/p" "$ROOT/$1" | head -n1
}
problems=0
check() {  # WHERE FOUND
  if [ "$2" != "$version" ]; then
    echo "release-version: $1 is '$2', the tag $tag says $version" >&2
    problems=1
  fi
}
check "helm/gpu-exporter/Chart.yaml: version" \
  "$(field helm/gpu-exporter/Chart.yaml '^version: *"\{0,1\}\([^"]*\)"\{0,1\} *$')"
check "helm/gpu-exporter/Chart.yaml: appVersion" \
  "$(field helm/gpu-exporter/Chart.yaml '^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$')"
check "pyproject.toml: project.version" "$(field pyproject.toml '^version = "\(.*\)"$')"
check "deploy/daemonset.yaml: the image's tag" \
  "$(field deploy/daemonset.yaml '^ *image: [^:]*:\([^@ ]*\) *$')"
[ "$problems" -eq 0 ] || exit 1
echo "version=$version"
echo "created=$(git -C "$ROOT" log -1 --format=%cI)"
