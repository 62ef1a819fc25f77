#!/usr/bin/env bash
# Regenerate the Python stubs of the vendored gRPC APIs: the kubelet's PodResources v1 and the
# container runtime's CRI v1 (kubernetes/cri-api; provenance beside each api.proto). The stubs
# are committed, so only run this after changing a proto or the grpcio-tools pin; then raise the
# grpcio/protobuf floors in pyproject.toml to what the new stubs check (GRPC_GENERATED_VERSION
# in api_pb2_grpc.py, ValidateProtobufRuntimeVersion in api_pb2.py).
# PYTHON: an interpreter with grpcio-tools (default .venv/bin/python).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PROTOS=(
  gpu_exporter/collect/k8s/podresources/v1/api.proto
  gpu_exporter/collect/k8s/cri/v1/api.proto
)

if ! "$PYTHON" -c 'import grpc_tools.protoc' 2>/dev/null; then
  echo "$PYTHON lacks grpcio-tools: $PYTHON -m pip install 'grpcio-tools==1.85.1'" >&2
  exit 1
fi
cd "$ROOT"
for proto in "${PROTOS[@]}"; do
  # -I . keeps the package path in the import that api_pb2_grpc.py makes of api_pb2.
  "$PYTHON" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. "$proto"
  echo "regenerated $(dirname "$proto")/api_pb2{.py,.pyi,_grpc.py}"
done
