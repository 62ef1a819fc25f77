"""Kubernetes integration: pod attribution from the kubelet PodResources API."""
