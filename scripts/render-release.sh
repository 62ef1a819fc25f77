#!/usr/bin/env bash
# What a release attaches besides the SBOMs (.github/workflows/release.yml, job `release`),
# written to OUT:
#   gpu-exporter-VERSION-kustomize.yaml  `kubectl kustomize deploy/`, the image pinned by digest
#   gpu-exporter-VERSION-helm.yaml       `helm template` of the chart with its default values
#                                        (release and namespace gpu-exporter, without the
#                                        `helm test` pod), the image pinned by digest
#   release-notes.md                     the image and the chart with their digests: how to
#                                        install them pinned and check their signatures
#
#   IMAGE=ghcr.io/gpu-exporter/gpu-exporter CHART_REPOSITORY=oci://ghcr.io/gpu-exporter/charts \
#   GITHUB_SERVER_URL=https://github.com GITHUB_WORKFLOW_REF=OWNER/REPO/.github/workflows/release.yml@refs/tags/vVERSION \
#     scripts/render-release.sh VERSION IMAGE_DIGEST CHART_DIGEST OUT
# GITHUB_SERVER_URL and GITHUB_WORKFLOW_REF are set on every GitHub Actions runner; together
# they are the identity in the signing certificate (Sigstore's keyless signing of a workflow:
# docs.sigstore.dev, "Verification cheat sheet").
# Fails when a rendered manifest does not run IMAGE@IMAGE_DIGEST: a deploy/ that named another
# image would be left alone by kustomize's `images`, silently. Needs helm and kubectl
# (scripts/install-tools.sh --helm-only).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELM="${HELM:-$ROOT/.tools/bin/helm}"
KUBECTL="${KUBECTL:-$ROOT/.tools/bin/kubectl}"

if [ $# -ne 4 ]; then
  echo "usage: render-release.sh VERSION IMAGE_DIGEST CHART_DIGEST OUT" >&2
  exit 2
fi
version="$1" image_digest="$2" chart_digest="$3" out="$4"
: "${IMAGE:?render-release: IMAGE (the image repository) is not set}"
: "${CHART_REPOSITORY:?render-release: CHART_REPOSITORY (oci://...) is not set}"
: "${GITHUB_SERVER_URL:?render-release: GITHUB_SERVER_URL is not set}"
: "${GITHUB_WORKFLOW_REF:?render-release: GITHUB_WORKFLOW_REF is not set}"
for digest in "$image_digest" "$chart_digest"; do
  if ! [[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]]; then
    echo "render-release: '$digest' is not a digest (sha256: and 64 hex digits)" >&2
    exit 2
  fi
done
for tool in "$HELM" "$KUBECTL"; do
  [ -x "$tool" ] || { echo "render-release: $tool is missing: scripts/install-tools.sh --helm-only" >&2; exit 1; }
done
mkdir -p "$out"
pinned="$IMAGE@$image_digest"

# deploy/ through a kustomization of its own outside the repository (kustomize refuses an
# overlay inside its base), which only pins the image.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat >"$work/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [$(realpath --relative-to="$work" "$ROOT/deploy")]
images:
  - name: $IMAGE
    digest: $image_digest
YAML
"$KUBECTL" kustomize "$work" >"$out/gpu-exporter-$version-kustomize.yaml"
"$HELM" template gpu-exporter "$ROOT/helm/gpu-exporter" --namespace gpu-exporter --skip-tests \
  --set "image.digest=$image_digest" >"$out/gpu-exporter-$version-helm.yaml"

for manifest in "$out/gpu-exporter-$version-kustomize.yaml" "$out/gpu-exporter-$version-helm.yaml"; do
  images="$(sed -n 's/^ *image: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$manifest" | sort -u)"
  if [ "$images" != "$pinned" ]; then
    echo "render-release: $manifest runs '${images//$'\n'/, }', not $pinned" >&2
    exit 1
  fi
done

identity="$GITHUB_SERVER_URL/$GITHUB_WORKFLOW_REF"
chart="${CHART_REPOSITORY#oci://}/gpu-exporter"
cat >"$out/release-notes.md" <<NOTES
## Image

\`$IMAGE:$version\` for linux/amd64 and linux/arm64

Digest: \`$image_digest\`

## Helm chart

\`$CHART_REPOSITORY/gpu-exporter\` version $version, digest \`$chart_digest\`

## Install with the image pinned by digest

\`\`\`sh
helm install gpu-exporter $CHART_REPOSITORY/gpu-exporter --version $version \\
  -n gpu-exporter --create-namespace --set image.digest=$image_digest
# or the manifests attached here, rendered with the same pin:
kubectl apply -f gpu-exporter-$version-kustomize.yaml
\`\`\`

## Verify the signatures

Both are signed keyless by this release's workflow run (Sigstore: Fulcio certificate, Rekor
transparency log):

\`\`\`sh
cosign verify $pinned \\
  --certificate-identity $identity \\
  --certificate-oidc-issuer https://token.actions.githubusercontent.com
cosign verify $chart@$chart_digest \\
  --certificate-identity $identity \\
  --certificate-oidc-issuer https://token.actions.githubusercontent.com
\`\`\`

## SBOM

The SPDX SBOMs attached here (one per platform) are also attached to the image as BuildKit
attestations, next to its SLSA provenance:
\`docker buildx imagetools inspect $pinned --format '{{ json .SBOM }}'\`.
NOTES
echo "render-release: wrote $(cd "$out" && ls | tr '\n' ' ')"
