# gpu-exporter container image.
#
# builder (BASE: any Debian 12 "bookworm" image) builds the wheel, installs it with its
# dependencies into a virtual environment at /opt/gpu-exporter, and assembles /rootfs: Debian's
# python3.11 and standard library, only the shared libraries that the interpreter, its extension
# modules and the wheels' extension modules link to (found with ldd), CA certificates, the UTC
# time zone, one unprivileged user, the dynamic linker's configuration and cache (the NVIDIA
# container toolkit adds libnvidia-ml.so.1 to /usr/lib/<arch> and refreshes that cache), the
# venv, and the Debian copyright files of everything copied.
# The final image is FROM scratch plus /rootfs: no shell, no package manager, no coreutils;
# it runs as UID/GID 65532 ("nonroot"). libnvidia-ml.so.1 comes from the node at run time (the
# NVIDIA container toolkit mounts it in with NVIDIA_DRIVER_CAPABILITIES=utility).
#
#   docker build -t gpu-exporter .
#   scripts/build-image.sh          # buildah, from a debootstrap'd local base (no registry needed)
#
# The builder uses Debian's python3 (3.11.2) rather than a python:3.11 image so that the same
# Dockerfile builds from Debian's apt repositories and PyPI alone.
#
# DCGM (optional; docs/kubernetes.md "DCGM: activity on GPUs before Hopper"): the default image
# carries no DCGM. With the build argument DCGM_DEB naming NVIDIA's DCGM 4 .deb files (space-
# separated), found at the top of the `dcgm-debs` stage, the image also carries every shared
# library those packages install in /usr/lib/<arch> (datacenter-gpu-manager-4-core: libdcgm.so.4
# and the host engine's modules, libdcgmmodule*.so.4, which it dlopens by name; -proprietary:
# libdcgmmoduleprofiling.so.4 and libnvperf_dcgm_host.so, for the profiling fields) and what they
# link to (ldd, as below). Not included: nv-hostengine, dcgmi, the diagnostic (nvvs) and its
# plugins. The .deb files come from NVIDIA's CUDA repository and cannot be downloaded in CI, so
# this variant is not built there; the default build is. Either replace the stage with a
# directory holding the files (BuildKit: --build-context dcgm-debs=DIR) or name an image that
# holds them (--build-arg DCGM_DEBS_FROM=IMAGE):
#   docker buildx build --build-context dcgm-debs=./dcgm-debs -t gpu-exporter:dcgm \
#     --build-arg DCGM_DEB="datacenter-gpu-manager-4-core_*.deb datacenter-gpu-manager-4-proprietary_*.deb" .
# (names or shell patterns, each of which must match a file).
# The image then holds NVIDIA's DCGM libraries under NVIDIA's license (their copyright files
# are in /usr/share/doc): check it before publishing such an image.
ARG BASE=docker.io/library/debian:bookworm-slim
ARG DCGM_DEBS_FROM=scratch

# Empty unless replaced: where DCGM_DEB's files are read from.
FROM ${DCGM_DEBS_FROM} AS dcgm-debs

FROM ${BASE} AS builder
# BuildKit's SBOM (the release workflow's `sbom: true`) scans this stage too: the final image
# has no dpkg database, so its Debian packages (python3.11, libssl3, ...) are only found here.
# The SBOM thus also lists build-only packages. Other builders ignore the argument.
ARG BUILDKIT_SBOM_SCAN_STAGE=true
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
# Debian package versions follow the base image's point release; pinning them would break the
# build at every Debian security update without making it more reproducible than BASE is.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv tzdata \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY rules ./rules
COPY docs/runbook.md ./docs/runbook.md
COPY gpu_exporter ./gpu_exporter
# The project's own wheel, then the venv; pip and setuptools leave the venv afterwards.
RUN python3 -m venv /opt/gpu-exporter \
 && /opt/gpu-exporter/bin/pip wheel --quiet --no-deps --wheel-dir /wheels /src \
 && /opt/gpu-exporter/bin/pip install --quiet /wheels/gpu_exporter-*.whl \
 && /opt/gpu-exporter/bin/pip uninstall --quiet -y pip setuptools \
 && /opt/gpu-exporter/bin/gpu-exporter --version

# DCGM_DEB (see the top): install the packages here (apt-get resolves their Debian
# dependencies), then put their libraries in /rootfs, where the next step's ldd finds what
# they link to and ldconfig makes them loadable by name. Empty: nothing happens.
ARG DCGM_DEB=""
# hadolint ignore=DL3003,DL3008,SC2086
RUN --mount=type=bind,from=dcgm-debs,target=/tmp/dcgm-debs \
    if [ -n "$DCGM_DEB" ]; then \
      arch="$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH"))')" \
      && mkdir -p /tmp/dcgm "/rootfs/usr/lib/$arch" \
      && (cd /tmp/dcgm-debs && for deb in $DCGM_DEB; do cp "$deb" /tmp/dcgm/; done) \
      && apt-get update \
      && apt-get install -y --no-install-recommends /tmp/dcgm/*.deb \
      && rm -rf /var/lib/apt/lists/* \
      && for deb in /tmp/dcgm/*.deb; do dpkg-deb -f "$deb" Package; done > /tmp/dcgm-packages \
      && while read -r pkg; do dpkg -L "$pkg"; done < /tmp/dcgm-packages \
         | grep -E "^(/usr)?/lib/$arch/lib[^/]*[.]so([.][0-9]+)*\$" | sort -u > /tmp/dcgm-libs \
      && { grep -q '/libdcgm[.]so[.]4$' /tmp/dcgm-libs \
           || { echo "DCGM_DEB: no libdcgm.so.4 in $DCGM_DEB" >&2; exit 1; }; } \
      && xargs -a /tmp/dcgm-libs cp -a -t "/rootfs/usr/lib/$arch/" \
      && while read -r pkg; do \
           find "/usr/share/doc/$pkg" -maxdepth 1 -type f \( -name copyright -o -iname '*licen[cs]e*' \) \
             -exec install -D -m 0644 -t "/rootfs/usr/share/doc/$pkg" {} + 2>/dev/null || true; \
         done < /tmp/dcgm-packages \
      && rm -rf /tmp/dcgm; \
    fi

# Assemble the runtime tree. Byte-code is compiled here because the root filesystem is
# read-only at run time.
RUN R=/rootfs \
 && arch="$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH"))')" \
 && mkdir -p "$R/usr/bin" "$R/usr/lib/$arch" "$R/usr/lib64" "$R/etc/ssl/certs" "$R/opt" \
      "$R/tmp" "$R/usr/share/doc" \
 && ln -s usr/bin "$R/bin" && ln -s usr/lib "$R/lib" && ln -s usr/lib64 "$R/lib64" \
 && chmod 1777 "$R/tmp" \
 && cp -a /usr/bin/python3.11 "$R/usr/bin/" && ln -s python3.11 "$R/usr/bin/python3" \
 && tar -C / -cf - \
      --exclude='usr/lib/python3.11/test' --exclude='usr/lib/python3.11/idlelib' \
      --exclude='usr/lib/python3.11/tkinter' --exclude='usr/lib/python3.11/turtledemo' \
      --exclude='usr/lib/python3.11/ensurepip' --exclude='usr/lib/python3.11/lib2to3' \
      --exclude='usr/lib/python3.11/pydoc_data' --exclude='usr/lib/python3.11/curses' \
      --exclude='usr/lib/python3.11/config-3.11-*' \
      --exclude='*/lib-dynload/_test*' --exclude='*/lib-dynload/_ctypes_test*' \
      --exclude='*/lib-dynload/xxlimited*' --exclude='*/lib-dynload/_xx*' \
      --exclude='*/lib-dynload/_curses*' --exclude='*/lib-dynload/readline*' \
      --exclude='*/lib-dynload/nis*' --exclude='*/lib-dynload/_dbm*' \
      --exclude='*/lib-dynload/ossaudiodev*' \
      usr/lib/python3.11 | tar -C "$R" -xf - \
 && cp -a /opt/gpu-exporter "$R/opt/" \
 && python3 -m compileall -q -j 0 "$R/usr/lib/python3.11" "$R/opt/gpu-exporter" >/dev/null \
 && { find "$R" -type f \( -name '*.so' -o -name '*.so.*' -o -name python3.11 \) -print0 \
        | xargs -0 ldd 2>/dev/null \
        | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'; \
      echo "/usr/lib/$arch/libgcc_s.so.1"; } \
      | grep -v "^$R/" | sort -u > /tmp/libs \
 && while read -r lib; do \
      dest="$R$(dirname "$lib" | sed -e 's,^/lib64,/usr/lib64,' -e 's,^/lib/,/usr/lib/,' -e 's,^/lib$,/usr/lib,')"; \
      mkdir -p "$dest" && cp -L "$lib" "$dest/"; \
    done < /tmp/libs \
 && for path in /usr/bin/python3.11 $(cat /tmp/libs); do \
      dpkg -S "$path" 2>/dev/null || dpkg -S "$(readlink -f "$path")" 2>/dev/null || true; \
    done | cut -d: -f1 | sort -u | while read -r pkg; do \
      if [ -f "/usr/share/doc/$pkg/copyright" ]; then \
        mkdir -p "$R/usr/share/doc/$pkg" && cp "/usr/share/doc/$pkg/copyright" "$R/usr/share/doc/$pkg/"; \
      fi; \
    done \
 && cp /etc/ssl/certs/ca-certificates.crt "$R/etc/ssl/certs/" \
 && mkdir -p "$R/usr/share/zoneinfo" && cp -L /usr/share/zoneinfo/Etc/UTC "$R/usr/share/zoneinfo/UTC" \
 && ln -s ../usr/share/zoneinfo/UTC "$R/etc/localtime" && echo UTC > "$R/etc/timezone" \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$R/etc/passwd" \
 && printf 'root:x:0:\nnonroot:x:65532:\n' > "$R/etc/group" \
 && printf 'hosts: files dns\n' > "$R/etc/nsswitch.conf" \
 && cp -a /etc/ld.so.conf /etc/ld.so.conf.d "$R/etc/" && ldconfig -r "$R" \
 && mkdir -p "$R/home/nonroot" \
 && chroot "$R" /opt/gpu-exporter/bin/python -c 'import ctypes, ssl, zlib, gpu_exporter.cli' \
 && chroot "$R" /opt/gpu-exporter/bin/gpu-exporter --version \
 && if [ -n "$DCGM_DEB" ]; then \
      chroot "$R" /opt/gpu-exporter/bin/python -c "$(printf '%s\n' \
        'import ctypes, sys' \
        'try: ctypes.CDLL("libdcgm.so.4")' \
        'except OSError as e:  # the driver libraries come from the node at run time' \
        '    sys.exit(0 if "libnvidia-ml" in str(e) or "libcuda" in str(e) else str(e))')"; \
    fi

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
COPY --from=builder /rootfs/ /
ENV PATH=/opt/gpu-exporter/bin:/usr/bin \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LABEL org.opencontainers.image.title="gpu-exporter" \
      org.opencontainers.image.description="GPU telemetry exporter and alerting daemon: NVML/GPM activity, throttling and health as Prometheus metrics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="scratch"
USER 65532:65532
EXPOSE 9449
ENTRYPOINT ["gpu-exporter"]
CMD ["serve"]
