#!/usr/bin/env bash
# Check the deployment files with the real tools (install them with scripts/install-tools.sh):
#   generated   deploy/prometheusrule.yaml, the chart's rule copy, values schema and README are up to date
#   lint        helm lint --strict, with the default values and with each ci/*-values.yaml
#   render      helm template (defaults; ServiceMonitor + PrometheusRule on; every toggle on;
#               pod attribution off; per-process attribution on; DRA attribution on) and
#               kubectl kustomize (deploy/; + components/restricted; + components/no-operator;
#               + components/process-attribution; + components/dra; + both of the last two)
#               into OUT/*.yaml
#   validate    kubernetes-validate --strict on every rendered file, for the oldest and newest
#               Kubernetes the chart supports (Chart.yaml kubeVersion: 1.25 .. 1.37)
#   rules       promtool check rules + test rules (rules/tests/*.yaml) on the PrometheusRule
#               spec extracted from the rendered chart and from deploy/, and on the rules
#               ConfigMap the daemon loads
#   hadolint    hadolint --failure-threshold style Dockerfile (every finding fails)
#
#   scripts/check-deploy.sh                  all of them, in a temporary directory
#   scripts/check-deploy.sh STEP... [-o OUT] only these steps; render output kept in OUT
# tests/test_deploy.py calls the steps one by one.
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT" || exit 1

K8S_VERSIONS=(1.25.0 1.37.0)
HELM="$ROOT/.tools/bin/helm"
KUBECTL="$ROOT/.tools/bin/kubectl"
CHART=helm/gpu-exporter
ALL_ON="$CHART/ci/all-on-values.yaml"

steps=()
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    generated | lint | render | validate | rules | hadolint) steps+=("$1"); shift ;;
    *) echo "usage: $0 [generated|lint|render|validate|rules|hadolint]... [-o OUTDIR]" >&2; exit 2 ;;
  esac
done
[ "${#steps[@]}" -eq 0 ] && steps=(generated lint render validate rules hadolint)
if [ -z "$out" ]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"

need() {  # fail, naming the installer, when a tool is missing
  local tool
  for tool in "$@"; do
    if [ ! -x "$tool" ] && ! command -v "$tool" >/dev/null 2>&1; then
      echo "check-deploy: $tool is missing: run scripts/install-tools.sh" >&2
      exit 1
    fi
  done
}

timed() {  # timed NAME COMMAND...: run, then print how long it took
  local name="$1" start end
  shift
  start=$(date +%s%N)
  "$@"
  end=$(date +%s%N)
  printf 'check-deploy: %-10s ok (%d ms)\n' "$name" $(((end - start) / 1000000))
}

step_generated() {
  bash scripts/gen-prometheusrule.sh --check
  "$VENV/bin/python" scripts/gen-values-schema.py --check
  "$VENV/bin/python" scripts/gen-chart-readme.py --check
}

step_lint() {
  need "$HELM"
  local values
  "$HELM" lint --strict --quiet "$CHART" >/dev/null
  for values in "$CHART"/ci/*-values.yaml; do
    "$HELM" lint --strict --quiet "$CHART" -f "$values" >/dev/null
  done
}

# A kustomization in OUT that uses deploy/ plus the given components (kustomize accepts only
# relative paths, and refuses a base that contains the overlay's directory).
kustomize_with() {  # NAME COMPONENT...
  local name="$1" dir rel
  shift
  dir="$out/kustomize-$name"
  mkdir -p "$dir"
  rel="$(realpath --relative-to="$dir" "$ROOT/deploy")"
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources: [$rel]"
    echo "components:"
    for component in "$@"; do echo "  - $rel/components/$component"; done
  } >"$dir/kustomization.yaml"
  "$KUBECTL" kustomize "$dir" >"$out/deploy-$name.yaml"
}

step_render() {
  need "$HELM" "$KUBECTL"
  "$HELM" template gpu-exporter "$CHART" -n gpu-exporter >"$out/chart-default.yaml"
  "$HELM" template gpu-exporter "$CHART" -n gpu-exporter --set serviceMonitor.enabled=true \
    --set prometheusRule.enabled=true >"$out/chart-operator.yaml"
  "$HELM" template gpu-exporter "$CHART" -n gpu-exporter -f "$ALL_ON" >"$out/chart-all-on.yaml"
  "$HELM" template gpu-exporter "$CHART" -n gpu-exporter --set podAttribution.enabled=false \
    >"$out/chart-restricted.yaml"
  "$HELM" template gpu-exporter "$CHART" -n gpu-exporter --set processAttribution.enabled=true \
    >"$out/chart-process-attribution.yaml"
  "$HELM" template gpu-exporter "$CHART" -n gpu-exporter --set podAttribution.dra.enabled=true \
    >"$out/chart-dra.yaml"
  "$KUBECTL" kustomize deploy >"$out/deploy.yaml"
  kustomize_with restricted restricted
  kustomize_with no-operator no-operator
  kustomize_with process-attribution process-attribution
  kustomize_with dra dra
  kustomize_with dra-process-attribution dra process-attribution
}

step_validate() {
  need "$VENV/bin/kubernetes-validate"
  local version files=("$out"/chart-*.yaml "$out"/deploy*.yaml) log="$out/kubernetes-validate.log"
  [ -e "${files[0]}" ] || { echo "check-deploy: run the render step first" >&2; exit 1; }
  for version in "${K8S_VERSIONS[@]}"; do
    # ServiceMonitor and PrometheusRule have no bundled schema: a WARN with status 0.
    if ! "$VENV/bin/kubernetes-validate" --strict --quiet -k "$version" "${files[@]}" >"$log" 2>&1; then
      cat "$log" >&2
      echo "check-deploy: kubernetes-validate --strict -k $version failed" >&2
      exit 1
    fi
  done
}

step_rules() {
  need promtool
  local source kind dir
  # SOURCE KIND: where the rules are taken from. The groups are written back into files named
  # like their sources in rules/ (rules/tests/*.yaml load ../gpu-exporter.rules.yaml and
  # ../gpu-exporter.recording.yaml); extra groups go to extra.yaml. The all-on variant
  # overrides GpuBusyButIdle and drops GpuTensorCoresIdle, so the pack's unit tests only hold
  # for the others.
  while read -r source kind; do
    [ -e "$out/$source.yaml" ] || { echo "check-deploy: run the render step first" >&2; exit 1; }
    dir="$out/rules-$source"
    rm -rf "$dir"
    mkdir -p "$dir/tests"
    "$VENV/bin/python" - "$out/$source.yaml" "$kind" "$dir" rules/*.yaml <<'PY'
import os, sys, yaml
path, kind, target, *pack = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
if kind == "PrometheusRule":
    found = [d["spec"]["groups"] for d in docs if d["kind"] == "PrometheusRule"]
else:  # the daemon's rules ConfigMap: one key per rule file
    found = [[g for text in d["data"].values() for g in yaml.safe_load(text)["groups"]]
             for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-rules")]
if len(found) != 1:
    sys.exit(f"{path}: expected one {kind}, found {len(found)}")
home = {g["name"]: os.path.basename(f) for f in pack for g in yaml.safe_load(open(f))["groups"]}
files = {}
for group in found[0]:
    files.setdefault(home.get(group["name"], "extra.yaml"), []).append(group)
for name, groups in files.items():
    with open(os.path.join(target, name), "w") as out:
        yaml.safe_dump({"groups": groups}, out, sort_keys=False)
# The shipped links (docs/runbook.md#...) are rendered absolute: every one under one base URL.
urls = {r["annotations"]["runbook_url"] for g in found[0] for r in g["rules"]
        if "runbook_url" in r.get("annotations", {}) and "#gpu" in r["annotations"]["runbook_url"]}
bases = {u.split("#")[0] for u in urls}
if len(bases) != 1 or not next(iter(bases)).startswith(("http://", "https://")):
    sys.exit(f"{path}: runbook links not under one absolute base URL: {sorted(bases)}")
open(os.path.join(target, "runbook_base"), "w").write(bases.pop())
PY
    promtool check rules "$dir"/*.yaml >/dev/null
    if [ "$source" != chart-all-on ]; then
      # The pack's unit tests expect the links as written in rules/; here they are absolute.
      base="$(cat "$dir/runbook_base")"
      for test_file in rules/tests/*.yaml; do
        sed "s|docs/runbook.md#|$base#|g" "$test_file" >"$dir/tests/$(basename "$test_file")"
      done
      (cd "$dir/tests" && promtool test rules ./*.yaml >/dev/null)
    fi
  done <<'LIST'
deploy PrometheusRule
chart-operator PrometheusRule
chart-all-on PrometheusRule
chart-default RulesConfigMap
LIST
}

step_hadolint() {
  need "$VENV/bin/hadolint"
  "$VENV/bin/hadolint" --no-color --failure-threshold style Dockerfile
}

for step in "${steps[@]}"; do
  timed "$step" "step_$step"
done
