"""kubelet PodResources v1: vendored api.proto and the stubs generated from it."""
