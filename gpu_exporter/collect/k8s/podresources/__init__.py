"""Generated kubelet PodResources API stubs (see scripts/gen-podresources.sh)."""
