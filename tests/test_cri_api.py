"""The vendored CRI API (kubernetes/cri-api's runtime v1 api.proto) and its generated stubs: the
proto is upstream's bytes, and the committed stubs are what grpc_tools makes of it."""

from __future__ import annotations

import hashlib
import os
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.promql.upstream import provenance

REPO = Path(__file__).resolve().parent.parent
CRI_DIR = REPO / "gpu_exporter" / "collect" / "k8s" / "cri" / "v1"
UPSTREAM_PATH = "pkg/apis/runtime/v1/api.proto"


def test_vendored_proto_is_upstream_byte_for_byte():
    """The git blob id PROVENANCE lists (as `git ls-tree v0.36.3` prints it upstream) and the
    file's own agree, so every byte is upstream's, its licence header included."""
    listing = provenance.read(CRI_DIR / "PROVENANCE")
    assert (listing.repository, listing.tag) == ("https://github.com/kubernetes/cri-api", "v0.36.3")
    assert listing.blobs == {UPSTREAM_PATH: "f05a5e05fddb3f6d5fb2430a7cfc9583e686ed47"}
    assert provenance.mismatches(listing, {UPSTREAM_PATH: CRI_DIR / "api.proto"}) == []
    text = (CRI_DIR / "api.proto").read_bytes()
    digest = hashlib.sha256(text).hexdigest()
    assert digest == "6d130c2651d335bfc755d25efc63072a1cd1eba3591ead6422dc0a27f20167f3"
    assert b"Licensed under the Apache License, Version 2.0" in text
    assert b"package runtime.v1;" in text


def test_committed_stubs_match_the_proto(tmp_path):
    """Also catches a `ruff format` run over the generated files (they must stay excluded)."""
    protoc = pytest.importorskip("grpc_tools.protoc")
    stub = (CRI_DIR / "api_pb2_grpc.py").read_text()
    committed = re.search(r"GRPC_GENERATED_VERSION = ['\"](.+)['\"]", stub)
    assert committed is not None, "api_pb2_grpc.py no longer looks generated"
    if committed[1] != version("grpcio-tools"):
        pytest.skip(f"stubs come from grpcio-tools {committed[1]}, not the one installed")
    proto = "gpu_exporter/collect/k8s/cri/v1/api.proto"
    args = ["protoc", f"-I{REPO}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}"]
    args += [f"--grpc_python_out={tmp_path}", str(REPO / proto)]
    assert protoc.main(args) == 0
    for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
        generated = (tmp_path / os.path.dirname(proto) / name).read_text()
        assert generated == (CRI_DIR / name).read_text(), f"{name}: run scripts/gen-grpc-stubs.sh"


def test_both_vendored_apis_load_side_by_side():
    """Two protos in one descriptor pool: their packages (runtime.v1, v1) keep them apart."""
    from gpu_exporter.collect.k8s.cri.v1 import api_pb2 as cri
    from gpu_exporter.collect.k8s.podresources.v1 import api_pb2 as podresources

    assert cri.DESCRIPTOR.package == "runtime.v1"
    assert podresources.DESCRIPTOR.package == "v1"
    assert "RuntimeService" in cri.DESCRIPTOR.services_by_name
