"""Generated kubelet PodResources API stubs (see scripts/gen-grpc-stubs.sh)."""
