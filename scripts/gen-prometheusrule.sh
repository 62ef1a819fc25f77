#!/usr/bin/env bash
# Regenerate what deploy/ and the Helm chart derive from rules/ and dashboards/:
#   deploy/prometheusrule.yaml           `gpu-exporter rules export` of rules/*.yaml
#   helm/gpu-exporter/files/rules/       copies of rules/*.yaml
#   helm/gpu-exporter/files/dashboards/  copies of dashboards/*.json
# Copies, not symlinks: `helm package` and chart repositories need real files inside the chart
# directory, and symlinks pointing out of it are not reliably followed.
# tests/test_deploy.py fails when anything here is out of date. --check: change nothing, exit 1
# (naming what differs) when a file is not what this script would write.
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT" || exit 1
PYTHON="${PYTHON:-$VENV/bin/python}"
check=0
[ "${1:-}" = --check ] && check=1

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/helm/gpu-exporter/files/rules" "$work/helm/gpu-exporter/files/dashboards" \
  "$work/deploy"
shopt -s nullglob
rule_files=(rules/*.yaml)
# deploy/configmap.yaml's alerting.runbook_base_url: the runbook the exporters serve, through
# deploy/service.yaml (tests/test_deploy.py checks that the two agree).
DEPLOY_RUNBOOK_BASE_URL=http://gpu-exporter.gpu-exporter.svc:9449/runbook
"$PYTHON" -m gpu_exporter rules export --name gpu-exporter \
  --label app.kubernetes.io/instance=gpu-exporter --label app.kubernetes.io/part-of=gpu-exporter \
  --runbook-base-url "$DEPLOY_RUNBOOK_BASE_URL" \
  "${rule_files[@]}" >"$work/deploy/prometheusrule.yaml"
cp "${rule_files[@]}" "$work/helm/gpu-exporter/files/rules/"
dashboards=(dashboards/*.json)
[ "${#dashboards[@]}" -gt 0 ] && cp "${dashboards[@]}" "$work/helm/gpu-exporter/files/dashboards/"

status=0
# Every generated file, and every file in the generated directories that should not be there.
while read -r target; do
  if [ ! -e "$work/$target" ]; then
    if [ "$check" = 1 ]; then
      echo "$target is stale (its source is gone): run scripts/gen-prometheusrule.sh" >&2
      status=1
    else
      rm -f "$target" && echo "removed $target"
    fi
  elif ! cmp -s "$work/$target" "$target"; then
    if [ "$check" = 1 ]; then
      echo "$target is out of date: run scripts/gen-prometheusrule.sh" >&2
      status=1
    else
      mkdir -p "$(dirname "$target")" && cp "$work/$target" "$target" && echo "wrote $target"
    fi
  fi
done < <(
  {
    (cd "$work" && find deploy helm -type f)
    find helm/gpu-exporter/files/rules helm/gpu-exporter/files/dashboards -type f 2>/dev/null
  } | sort -u
)
exit "$status"
