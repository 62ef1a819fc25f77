"""Generated CRI (Container Runtime Interface) API stubs (see scripts/gen-grpc-stubs.sh)."""
