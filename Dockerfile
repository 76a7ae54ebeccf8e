# syntax=docker/dockerfile:1
# EZRA in a container:
#   docker build -t ezra .
#   docker run -d --name ezra -p 127.0.0.1:42002:42002 -v ezra_data:/data ezra
# (the host's loopback only: serving other machines needs -e EZRA_PASSWORD=...)
# The builder stage makes the one-file binary (scripts/build-binary.sh, as
# for the release binaries); the final image holds that binary on a
# distroless base (glibc, /tmp, a non-root user; no shell, no Python).

FROM python:3.11-slim-bookworm AS builder
# binutils: PyInstaller strips the bundled libraries and writes the archive
# into an ELF section with objcopy.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY setup.cfg ezra.spec ./
COPY scripts/build-binary.sh scripts/
COPY ezra/ ezra/
RUN --mount=type=cache,target=/root/.cache/pip \
    scripts/build-binary.sh \
 && install -D -m 0755 build/dist/ezra-linux_* /out/usr/local/bin/ezra \
 && install -d -m 0700 /out/data

FROM gcr.io/distroless/base-nossl-debian12:nonroot
COPY --from=builder /out/usr/local/bin/ezra /usr/local/bin/ezra
# A new named volume starts as a copy of this directory: owned by the
# non-root user, so EZRA can create ezra.db in it.
COPY --from=builder --chown=65532:65532 /out/data /data
USER 65532:65532
# Protected mode off, as in the official Redis image: in a container no client
# comes from 127.0.0.1, so it would refuse every one, the host's own included.
# The published port is the boundary (docs/usage.md#docker): publish it on the
# host's loopback, or set EZRA_PASSWORD.
ENV EZRA_DATA_DIR=/data \
    EZRA_BIND=0.0.0.0 \
    EZRA_PORT=42002 \
    EZRA_PROTECTED_MODE=no
VOLUME ["/data"]
EXPOSE 42002
# `ezra ping` reads the same EZRA_* variables as the server (port, password).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/ezra", "ping"]
# Exec form: SIGTERM from `docker stop` goes to EZRA, which stops cleanly.
ENTRYPOINT ["/usr/local/bin/ezra"]
