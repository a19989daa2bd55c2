#!/usr/bin/env bash
# Pack what the lent GPU machine needs to run narrator into parts small enough to carry,
# one per `run` call (see docs/GPU.md for the whole sequence).
#
#   bash ops/gpu-bundle.sh [--level N] [--part-mib N] [--full-espeak] [--with-cpu-ort] [--force]
#
# The device has no network, no cargo and no pip, and each call carries at most 64 MiB of
# ignored files. So everything travels as one tar stream, compressed with zstd and split:
#
#   .gpu-bundle/part-00, part-01, ...   the parts (56 MiB each; a call's 64 MiB also holds
#                                       the work tree, ~2 MiB, and meta/)
#   .gpu-bundle/meta/                   carried with EVERY part (small, ~2 MiB):
#       parts.sha256    sha256 of each part (sha256sum format)
#       bundle.sha256   sha256 of the whole compressed stream (the parts concatenated)
#       BUNDLE.txt      what is inside, versions, the glibc the binaries need
#       tools/          a zstd decompressor with its libraries, for a device without zstd
#
# Inside the stream (unpacked by `ops/gpu-check.sh run`), under narrator-gpu/:
#   bin/narrator                      target/release/narrator, stripped (target/ untouched)
#   deps/onnxruntime-gpu/             ONNX Runtime's CUDA build (libonnxruntime.so.1.31.1 +
#                                     symlink, providers_shared, providers_cuda)
#   deps/onnxruntime/                 the CPU build, only with --with-cpu-ort
#   deps/voices/                      en_US-joe-medium.onnx + .onnx.json
#   deps/voices/kokoro/               Kokoro-82M (model.onnx, model.fp32.onnx, vocab.json, install.json) and the
#                                     voices af_heart, af_bella, af_sky, when installed
#                                     (ops/setup.sh --kokoro)
#   deps/espeak-ng-data/              Piper's espeak-ng data, English only (the phoneme
#                                     tables, en_dict, lang/, voices/; --full-espeak: all)
#   lib/                              libespeak-ng.so.1 and every library narrator and it
#                                     need beyond glibc and libstdc++ (from `ldd`)
#   corpus/alice29.txt                the whole-book text
#
# Idempotent: when the inputs and options have not changed and the parts verify, it only
# prints. Needs: a release build (cargo build --release -p narrator), `bash ops/setup.sh
# --gpu`, the corpus (/work/shared/corpus or ../shared/corpus, or NARRATOR_CORPUS=FILE).
# Needs zstd and binutils (strip, objdump): `bash ops/setup.sh --gpu` installs them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

LEVEL=12
PART_MIB=56
FULL_ESPEAK=0
WITH_CPU_ORT=0
FORCE=0
VOICE=en_US-joe-medium
ORT_GPU_VERSION=1.31.1
while (($#)); do
    case "$1" in
        --level) LEVEL=${2:?--level needs a number}; shift 2 ;;
        --part-mib) PART_MIB=${2:?--part-mib needs a number}; shift 2 ;;
        --full-espeak) FULL_ESPEAK=1; shift ;;
        --with-cpu-ort) WITH_CPU_ORT=1; shift ;;
        --force) FORCE=1; shift ;;
        -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu-bundle: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $LEVEL =~ ^[0-9]+$ && $LEVEL -ge 1 && $LEVEL -le 19 ]] || { echo "gpu-bundle: --level 1..19" >&2; exit 2; }
[[ $PART_MIB =~ ^[0-9]+$ && $PART_MIB -ge 1 && $PART_MIB -le 60 ]] || { echo "gpu-bundle: --part-mib 1..60 (a call carries at most 64 MiB, meta/ included)" >&2; exit 2; }

say() { printf 'gpu-bundle: %s\n' "$*" >&2; }
die() { printf 'gpu-bundle: ERROR: %s\n' "$*" >&2; exit 1; }

# ---- tools ------------------------------------------------------------------------------
for t in zstd strip objdump ldd sha256sum split tar; do
    command -v "$t" >/dev/null || die "$t is missing: run \`bash ops/setup.sh --gpu\` (it installs zstd and binutils)"
done

# ---- inputs -------------------------------------------------------------------------------
BIN=${NARRATOR_BIN:-$ROOT/target/release/narrator}
DEPS=${NARRATOR_DATA_DIR:-$ROOT/.deps}
ORT_GPU=$DEPS/onnxruntime-gpu
ORT_CPU=$DEPS/onnxruntime
ESPEAK=$DEPS/espeak-ng-data
CORPUS=${NARRATOR_CORPUS:-}
if [[ -z $CORPUS ]]; then
    for c in "$ROOT/../shared/corpus/alice29.txt" /work/shared/corpus/alice29.txt; do
        [[ -f $c ]] && { CORPUS=$c; break; }
    done
fi

[[ -x $BIN ]] || die "no narrator binary at $BIN: build it first (cargo build --release -p narrator), or set NARRATOR_BIN"
"$BIN" --version | grep -q fleet || die "$BIN was built without the distributed mode (README command 1 builds it so): cargo build --release -p narrator"
[[ -f $ORT_GPU/libonnxruntime_providers_cuda.so && -f $ORT_GPU/libonnxruntime.so.$ORT_GPU_VERSION ]] \
    || die "ONNX Runtime's CUDA build is missing in $ORT_GPU: run \`bash ops/setup.sh --gpu\` first"
[[ -f $ORT_GPU/libonnxruntime_providers_shared.so ]] || die "$ORT_GPU/libonnxruntime_providers_shared.so is missing: run \`bash ops/setup.sh --gpu\` again"
[[ -f $DEPS/voices/$VOICE.onnx && -f $DEPS/voices/$VOICE.onnx.json ]] || die "voice $VOICE is missing in $DEPS/voices: run \`bash ops/setup.sh\` first"
[[ -f $ESPEAK/phontab && -f $ESPEAK/en_dict ]] || die "espeak-ng data is missing in $ESPEAK: run \`bash ops/setup.sh\` first"
[[ -n $CORPUS && -f $CORPUS ]] || die "corpus alice29.txt not found (looked in ../shared/corpus and /work/shared/corpus): set NARRATOR_CORPUS=FILE"
if ((WITH_CPU_ORT)); then
    compgen -G "$ORT_CPU/libonnxruntime.so.*" >/dev/null || die "--with-cpu-ort: no CPU build in $ORT_CPU: run \`bash ops/setup.sh\` first"
fi

# English-only espeak-ng data: what espeak-ng reads for the en-us voice. Checked against
# the whole data set on all of alice29.txt and foreign words (identical phonemes).
ESPEAK_FILES=(phontab phonindex phondata intonations en_dict lang voices)
if ((FULL_ESPEAK)); then
    ESPEAK_FILES=()
    while IFS= read -r f; do ESPEAK_FILES+=("$f"); done < <(cd "$ESPEAK" && ls -A)
fi
for f in "${ESPEAK_FILES[@]}"; do
    [[ -e $ESPEAK/$f ]] || die "espeak-ng data lacks $f: run \`bash ops/setup.sh\` again"
done

# Shared libraries: narrator's and libespeak-ng's closure from ldd, less glibc, the loader
# and the C++ runtime (the device has its own; mixing glibc builds breaks processes).
SYSTEM_LIBS='^(linux-vdso|linux-gate|ld-linux|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnsl\.so|libBrokenLocale\.so|libstdc\+\+\.so|libgcc_s\.so)'
ldd_closure() { # prints "name path" for each library ldd resolves; fails on "not found"
    local out
    out=$(ldd "$1") || die "ldd $1 failed"
    if grep -q 'not found' <<<"$out"; then
        die "ldd $1: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ' | paste -sd, -) (install the Debian packages ops/setup.sh lists)"
    fi
    awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' <<<"$out"
}
declare -A LIBS=()
bin_closure=$(ldd_closure "$BIN")
espeak_lib=$(ldd "$BIN" | awk '$1 == "libespeak-ng.so.1" { print $3 }')
[[ -n $espeak_lib ]] || espeak_lib=$(ldconfig -p | awk '$1 == "libespeak-ng.so.1" && /x86-64/ { print $NF; exit }')
[[ -n $espeak_lib && -f $espeak_lib ]] || die "libespeak-ng.so.1 not found: install libespeak-ng-dev (bash ops/setup.sh)"
espeak_closure=$(ldd_closure "$espeak_lib")
while read -r name path; do
    [[ -z $name || $name =~ $SYSTEM_LIBS ]] && continue
    LIBS[$name]=$path
done <<<"$bin_closure"$'\n'"$espeak_closure"
LIBS[libespeak-ng.so.1]=$espeak_lib

# ---- up to date? --------------------------------------------------------------------------
OUTDIR=$ROOT/.gpu-bundle
META=$OUTDIR/meta
inputs_list() {
    local f
    {
        printf 'options level=%s part_mib=%s full_espeak=%s cpu_ort=%s\n' "$LEVEL" "$PART_MIB" "$FULL_ESPEAK" "$WITH_CPU_ORT"
        printf 'script %s\n' "$(sha256sum "$0" | cut -d' ' -f1)"
        for f in "$BIN" "$ORT_GPU"/libonnxruntime* "$DEPS/voices/$VOICE.onnx" "$DEPS/voices/$VOICE.onnx.json" \
            "$CORPUS" $(printf '%s\n' "${LIBS[@]}" | sort); do
            printf 'input %s %s\n' "$f" "$(stat -L -c '%s %Y' "$f")"
        done
        ((WITH_CPU_ORT)) && for f in "$ORT_CPU"/libonnxruntime*; do printf 'input %s %s\n' "$f" "$(stat -L -c '%s %Y' "$f")"; done
        (cd "$ESPEAK" && find "${ESPEAK_FILES[@]}" -type f -printf 'espeak %p %s %T@\n' | sort)
    } | sha256sum | cut -d' ' -f1
}
FINGERPRINT=$(inputs_list)

print_sequence() {
    local parts=("$OUTDIR"/part-*) p n=0 last total=0
    echo
    echo "parts in .gpu-bundle/ (each call carries one, with .gpu-bundle/meta):"
    for p in "${parts[@]}"; do
        printf '  %s  %6.1f MiB  %s\n' "$(basename "$p")" "$(($(stat -c %s "$p") * 10 / 1048576))e-1" \
            "$(awk -v n="$(basename "$p")" '$2 == n { print substr($1, 1, 16) }' "$META/parts.sha256")"
        total=$((total + $(stat -c %s "$p")))
    done
    printf '  meta/   %6.1f MiB\n' "$(($(du -sb "$META" | cut -f1) * 10 / 1048576))e-1"
    printf '  total   %6.1f MiB in %d part(s); whole stream sha256 %s\n' "$((total * 10 / 1048576))e-1" "${#parts[@]}" \
        "$(cut -d' ' -f1 "$META/bundle.sha256")"
    local tree biggest
    tree=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    biggest=$(stat -c %s "${parts[0]}")
    printf '  one call carries %.1f MiB: work tree %.1f + meta %.1f + part %.1f (limit 64)\n' \
        "$(((tree + $(du -sb "$META" | cut -f1) + biggest) * 10 / 1048576))e-1" "$((tree * 10 / 1048576))e-1" \
        "$(($(du -sb "$META" | cut -f1) * 10 / 1048576))e-1" "$((biggest * 10 / 1048576))e-1"
    if ((tree + $(du -sb "$META" | cut -f1) + biggest > 63 * 1048576)); then
        say "WARNING: a call would carry more than 63 MiB: rebuild with a smaller --part-mib, or shrink the work tree"
    fi
    echo
    echo "run calls (see docs/GPU.md), back to back, under 20 s apart so the machine stays warm:"
    last=$((${#parts[@]} - 1))
    for p in "${parts[@]}"; do
        local name
        name=$(basename "$p")
        if ((n < last)); then
            printf '  %d. run  carry=[".gpu-bundle/meta", ".gpu-bundle/%s"]  timeout_s=120\n        command: bash ops/gpu-check.sh stage .gpu-bundle/%s\n' "$((n + 1))" "$name" "$name"
        else
            printf '  %d. run  carry=[".gpu-bundle/meta", ".gpu-bundle/%s"]  timeout_s=480\n        command: bash ops/gpu-check.sh stage .gpu-bundle/%s && bash ops/gpu-check.sh run\n' "$((n + 1))" "$name" "$name"
        fi
        n=$((n + 1))
    done
    echo "  rerun (parts stay staged while the machine is warm, under 30 s idle): command: bash ops/gpu-check.sh run --quick  timeout_s=300"
    echo "  then: give_back"
}

if ((!FORCE)) && [[ -f $META/inputs.sha256 && $(cat "$META/inputs.sha256") == "$FINGERPRINT" ]] \
    && compgen -G "$OUTDIR/part-*" >/dev/null \
    && (cd "$OUTDIR" && sha256sum --quiet -c meta/parts.sha256) \
    && [[ $(find "$OUTDIR" -maxdepth 1 -name 'part-*' | wc -l) == $(wc -l <"$META/parts.sha256") ]]; then
    say "up to date (inputs unchanged, parts verified; --force rebuilds)"
    print_sequence
    exit 0
fi

# ---- the tree -----------------------------------------------------------------------------
mkdir -p "$OUTDIR"
WORK=$(mktemp -d "$OUTDIR/.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
T=$WORK/tree/narrator-gpu
mkdir -p "$T/bin" "$T/deps/onnxruntime-gpu" "$T/deps/voices" "$T/deps/espeak-ng-data" "$T/lib" "$T/corpus"

say "stripping $(basename "$BIN") ($(du -h "$BIN" | cut -f1)) into the bundle"
strip --strip-all -o "$T/bin/narrator" "$BIN"
chmod 755 "$T/bin/narrator"

# Hard links where possible (same file system): no copy of 300 MB.
link() { ln -f "$1" "$2" 2>/dev/null || cp -f "$1" "$2"; }
for f in "libonnxruntime.so.$ORT_GPU_VERSION" libonnxruntime_providers_shared.so libonnxruntime_providers_cuda.so; do
    link "$ORT_GPU/$f" "$T/deps/onnxruntime-gpu/$f"
done
ln -s "libonnxruntime.so.$ORT_GPU_VERSION" "$T/deps/onnxruntime-gpu/libonnxruntime.so"
if ((WITH_CPU_ORT)); then
    mkdir -p "$T/deps/onnxruntime"
    cpu_lib=$(find "$ORT_CPU" -maxdepth 1 -type f -name 'libonnxruntime.so.*' | sort | tail -1)
    link "$cpu_lib" "$T/deps/onnxruntime/$(basename "$cpu_lib")"
    ln -s "$(basename "$cpu_lib")" "$T/deps/onnxruntime/libonnxruntime.so"
    [[ -f $ORT_CPU/libonnxruntime_providers_shared.so ]] && link "$ORT_CPU/libonnxruntime_providers_shared.so" "$T/deps/onnxruntime/"
fi
link "$DEPS/voices/$VOICE.onnx" "$T/deps/voices/$VOICE.onnx"
link "$DEPS/voices/$VOICE.onnx.json" "$T/deps/voices/$VOICE.onnx.json"
[[ -f $DEPS/voices/MODEL_CARD ]] && cp "$DEPS/voices/MODEL_CARD" "$T/deps/voices/"
# The second model family, for the GPU check's Kokoro steps (three voices: a plain one and
# a blend's parents).
if [[ -f $DEPS/voices/kokoro/model.onnx ]]; then
    mkdir -p "$T/deps/voices/kokoro/voices"
    for f in model.onnx vocab.json install.json; do
        link "$DEPS/voices/kokoro/$f" "$T/deps/voices/kokoro/$f"
    done
    # The fp32 graph CUDA runs (ops/setup.sh --kokoro --gpu); without it the int8 graph
    # would run its integer kernels on the CPU.
    [[ -f $DEPS/voices/kokoro/model.fp32.onnx ]] && link "$DEPS/voices/kokoro/model.fp32.onnx" "$T/deps/voices/kokoro/model.fp32.onnx"
    for v in af_heart af_bella af_sky; do
        link "$DEPS/voices/kokoro/voices/$v.bin" "$T/deps/voices/kokoro/voices/$v.bin"
    done
fi
(cd "$ESPEAK" && cp -a "${ESPEAK_FILES[@]}" "$T/deps/espeak-ng-data/")
for name in "${!LIBS[@]}"; do
    cp -L "${LIBS[$name]}" "$T/lib/$name"
done
chmod -R u+w,a+rX "$T"
cp "$CORPUS" "$T/corpus/alice29.txt"

# What the binaries need from the device's glibc (the newest symbol version they use).
glibc_floor() {
    find "$T/bin" "$T/lib" "$T/deps" -type f \( -name '*.so*' -o -path '*/bin/*' \) -print0 \
        | xargs -0 objdump -T 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -Vu | tail -1
}
FLOOR=$(glibc_floor)
GIT_REV=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$ROOT" diff --quiet HEAD -- crates Cargo.lock 2>/dev/null || GIT_REV="$GIT_REV+dirty"
{
    echo "narrator GPU bundle"
    echo "created $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) from $ROOT (git $GIT_REV)"
    echo "binary: $("$BIN" --version 2>/dev/null || echo "?")"
    echo "onnxruntime-gpu $ORT_GPU_VERSION (CUDA 13, cuDNN 9); voice $VOICE"
    echo "espeak-ng data: $( ((FULL_ESPEAK)) && echo all || echo 'English only') ; libespeak-ng $(basename "$(readlink -f "$espeak_lib")")"
    echo "needs glibc >= ${FLOOR#GLIBC_} (built on $(ldd --version | head -1))"
    echo "zstd level $LEVEL --long=27; parts of $PART_MIB MiB"
    echo "libraries in lib/: $(printf '%s\n' "${!LIBS[@]}" | sort | paste -sd' ' -)"
    echo
    (cd "$WORK/tree" && find narrator-gpu -type f -print0 | sort -z | xargs -0 sha256sum)
} >"$T/BUNDLE.txt"

# ---- stream, compress, split ----------------------------------------------------------------
NEW=$WORK/out
mkdir -p "$NEW/meta/tools"
raw=$(du -sb --apparent-size "$WORK/tree" | cut -f1)
say "packing $((raw / 1048576)) MiB: tar | zstd -$LEVEL --long=27 | split -b ${PART_MIB}M (well under a minute on 2 cores)"
tar -C "$WORK/tree" --owner=0 --group=0 --numeric-owner --sort=name -cf - narrator-gpu \
    | zstd -q -T0 "-$LEVEL" --long=27 -c \
    | split -b "${PART_MIB}M" -d -a 2 - "$NEW/part-"
(cd "$NEW" && sha256sum part-*) >"$NEW/meta/parts.sha256"
printf '%s  bundle.tar.zst\n' "$(cat "$NEW"/part-* | sha256sum | cut -d' ' -f1)" >"$NEW/meta/bundle.sha256"
cp "$T/BUNDLE.txt" "$NEW/meta/BUNDLE.txt"
echo "$FINGERPRINT" >"$NEW/meta/inputs.sha256"

# A zstd that runs without the device's zstd: this machine's binary and its libraries.
zstd_bin=$(command -v zstd)
cp -L "$zstd_bin" "$NEW/meta/tools/zstd"
zstd_closure=$(ldd_closure "$zstd_bin")
while read -r name path; do
    [[ -z $name || $name =~ $SYSTEM_LIBS ]] && continue
    cp -L "$path" "$NEW/meta/tools/$name"
done <<<"$zstd_closure"
chmod -R a+rX "$NEW/meta"

# Swap the new parts in (old parts of another size must not linger).
rm -rf "$OUTDIR"/part-* "$META"
mv "$NEW"/part-* "$OUTDIR/"
mv "$NEW/meta" "$META"
grep -qxF '/.gpu-bundle' "$ROOT/.gitignore" 2>/dev/null || say "note: add /.gpu-bundle to .gitignore"
say "done: glibc >= ${FLOOR#GLIBC_} needed on the device"
print_sequence
