"""Where the vendored Prometheus files come from, checked without the network.

A PROVENANCE file lists each vendored file as `git ls-tree TAG PATH` prints it in Prometheus'
repository: mode, type, git blob id, path. A blob id is the SHA-1 of `blob <size>\\0<bytes>`, so
comparing it with the file's own proves the bytes are upstream's at that tag (anyone can run the
same `git ls-tree` on github.com/prometheus/prometheus to see the listing is upstream's).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


def blob_id(data: bytes) -> str:
    """Git's id of a file with these bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Provenance:
    repository: str
    tag: str
    commit: str
    blobs: dict[str, str]  # upstream path -> git blob id


def read(path: Path) -> Provenance:
    header: dict[str, str] = {}
    blobs: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if "\t" in line:  # <mode> blob <id>\t<path>
            meta, upstream_path = line.split("\t")
            _, kind, blob = meta.split()
            assert kind == "blob", line
            blobs[upstream_path] = blob
        else:
            key, _, value = line.partition(": ")
            header[key] = value
    return Provenance(header["repository"], header["tag"], header["commit"], blobs)


def mismatches(provenance: Provenance, files: dict[str, Path]) -> list[str]:
    """Each vendored file (upstream path -> local file) whose bytes are not upstream's."""
    out = []
    for upstream_path, local in sorted(files.items()):
        expected = provenance.blobs.get(upstream_path)
        if expected is None:
            out.append(f"{local}: {upstream_path} is not in the provenance listing")
        elif blob_id(local.read_bytes()) != expected:
            out.append(f"{local}: not the bytes of {upstream_path} at {provenance.tag}")
    return out
