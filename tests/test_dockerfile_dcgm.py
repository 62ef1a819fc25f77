"""The Dockerfile's optional DCGM step (build argument DCGM_DEB; docs/kubernetes.md "DCGM:
activity on GPUs before Hopper") leaves the default image as it is: the argument defaults to
empty, the stage the packages are read from defaults to an empty one, the step does nothing
when the argument is empty (run here with every external command replaced by one that fails),
and DCGM reaches the final image only through /rootfs, which the default build does not add to.

NVIDIA's packages cannot be downloaded in CI, so the variant itself is not built there.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: continuation lines joined as Docker joins
    them (the backslash and newline removed), comment lines dropped."""
    found: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not current and not line.strip()):
            continue
        if line.endswith("\\"):
            current += line[:-1]
            continue
        current += line
        word, _, rest = current.strip().partition(" ")
        found.append((word.upper(), rest.strip()))
        current = ""
    assert not current, "the Dockerfile ends inside a continued instruction"
    return found


def stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each stage (index 0: the global ARGs before the first FROM)."""
    result: list[list[tuple[str, str]]] = [[]]
    for instruction in instructions(text):
        if instruction[0] == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


def _dcgm_run() -> str:
    """The shell command of the builder's DCGM step, without its --mount flag."""
    (builder,) = [s for s in stages(DOCKERFILE.read_text()) if s and "AS builder" in s[0][1]]
    runs = [args for word, args in builder if word == "RUN" and "/tmp/dcgm-debs" in args]
    assert len(runs) == 1, runs
    mount, _, command = runs[0].partition(" ")
    assert mount == "--mount=type=bind,from=dcgm-debs,target=/tmp/dcgm-debs"
    return command


def test_the_dcgm_arguments_default_to_nothing():
    text = DOCKERFILE.read_text()
    args = {
        name: value
        for word, rest in instructions(text)
        if word == "ARG"
        for name, _, value in [rest.partition("=")]
    }
    assert args["DCGM_DEB"] == '""'
    assert args["DCGM_DEBS_FROM"] == "scratch"
    global_args = [rest for word, rest in stages(text)[0] if word == "ARG"]
    assert "DCGM_DEBS_FROM=scratch" in global_args
    froms = [rest for word, rest in instructions(text) if word == "FROM"]
    assert "${DCGM_DEBS_FROM} AS dcgm-debs" in froms
    # Nothing builds the image with a DCGM argument by default.
    assert "DCGM" not in (ROOT / "scripts" / "build-image.sh").read_text()


def test_dcgm_reaches_the_image_only_through_rootfs():
    final = stages(DOCKERFILE.read_text())[-1]
    assert final[0] == ("FROM", "scratch")
    copies = [rest for word, rest in final if word in ("COPY", "ADD")]
    assert copies == ["--from=builder /rootfs/ /"]
    assert not [i for i in final if re.search("dcgm", i[1], re.IGNORECASE)]


def test_every_dcgm_command_is_guarded_by_the_argument():
    """Outside ARG/FROM, DCGM appears only in RUN steps, and each use sits inside
    `if [ -n "$DCGM_DEB" ]; then ... fi`."""
    guard = 'if [ -n "$DCGM_DEB" ]; then'
    for word, args in instructions(DOCKERFILE.read_text()):
        if word in ("ARG", "FROM") or not re.search("dcgm", args, re.IGNORECASE):
            continue
        assert word == "RUN", (word, args)
        outside = re.sub(re.escape(guard) + r".*?\bfi\b", "", args, flags=re.S)
        if "from=dcgm-debs" in args:  # the mount names the stage; the step itself is guarded
            outside = outside.replace("--mount=type=bind,from=dcgm-debs,target=/tmp/dcgm-debs", "")
        assert not re.search("dcgm", outside, re.IGNORECASE), outside


def _run_with_failing_commands(command: str, dcgm_deb: str, tmp_path: Path):
    """Run `command` in the builder's shell with DCGM_DEB set, every external command a stub
    that records its call and fails."""
    tmp_path = tmp_path / f"run-{dcgm_deb or 'empty'}"
    stubs = tmp_path / "bin"
    stubs.mkdir(parents=True)
    log = tmp_path / "calls"
    for name in (
        "apt-get", "cp", "dpkg", "dpkg-deb", "find", "grep", "install", "mkdir", "python3",
        "rm", "sort", "xargs", "chroot",
    ):  # fmt: skip
        stub = stubs / name
        stub.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit 97\n')
        stub.chmod(0o755)
    result = subprocess.run(
        ["/bin/bash", "-euo", "pipefail", "-c", command],  # the Dockerfile's SHELL
        # R: the assembly step's root, set earlier in its command.
        env={"PATH": str(stubs), "DCGM_DEB": dcgm_deb, "HOME": str(tmp_path), "R": "/rootfs"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return result, calls


def test_the_dcgm_step_does_nothing_without_the_argument(tmp_path):
    assert 'SHELL ["/bin/bash", "-euo", "pipefail", "-c"]' in [
        f"{word} {args}" for word, args in instructions(DOCKERFILE.read_text())
    ]
    result, calls = _run_with_failing_commands(_dcgm_run(), "", tmp_path)
    assert (result.returncode, calls) == (0, []), result.stderr


def test_the_dcgm_step_acts_with_the_argument(tmp_path):
    """The harness above can see a step that acts: with a package named, it runs commands."""
    result, calls = _run_with_failing_commands(_dcgm_run(), "dcgm.deb", tmp_path)
    assert result.returncode == 97 and calls, result.stderr
    command = _dcgm_run()
    for needed in ("apt-get install", "libdcgm[.]so[.]4", "/rootfs/usr/lib/$arch"):
        assert needed in command, needed


def test_the_assembly_checks_libdcgm_only_with_the_argument(tmp_path):
    (assembly,) = [
        args
        for word, args in instructions(DOCKERFILE.read_text())
        if word == "RUN" and "ldd" in args
    ]
    tail = assembly[assembly.index("gpu-exporter --version") :]
    check = tail[tail.index("if [") :]
    assert "libdcgm.so.4" in check
    result, calls = _run_with_failing_commands(check, "", tmp_path)
    assert (result.returncode, calls) == (0, []), result.stderr
    result, calls = _run_with_failing_commands(check, "dcgm.deb", tmp_path)
    assert result.returncode == 97 and calls[0].startswith("chroot "), calls
