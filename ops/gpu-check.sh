#!/usr/bin/env bash
# GPU verification on a machine with an NVIDIA GPU, in one run, one table at the end.
#
#   bash ops/gpu-check.sh [--device cuda:N] [--book FILE]
#
# 1. installs the CUDA build of ONNX Runtime (PyPI onnxruntime-gpu, with the CUDA 12 and
#    cuDNN 9 libraries from PyPI nvidia-* wheels) into .deps/gpu (idempotent; set
#    NARRATOR_GPU_WHEELS=DIR to install from a folder of wheels on a machine without
#    network);
# 2. runs `narrator doctor` against it;
# 3. calibrates the voice on the GPU (`narrator plan --calibrate always`): batch 1, 2, 4, …
#    until throughput stops improving by 5 %, with memory per padded token;
# 4. synthesizes the same chapter with batch 1 and with the planned batch, back to back;
# 5. prints one table: batch, seconds, × realtime, and the ratio planned / batch 1.
#
# Targets (issue 4): planned batch ≥ 4× the throughput of batch 1; ≥ 1000× realtime.
# Everything it prints also goes to $OUT (or out/gpu-check) as files.
# Needs: ops/setup.sh done (voice, espeak data), a release build or cargo, nvidia-smi.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEVICE=cuda:0
BOOK=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --book) BOOK=$2; shift 2 ;;
        *) echo "gpu-check: unknown argument $1 (use --device cuda:N, --book FILE)" >&2; exit 2 ;;
    esac
done
OUTDIR=${OUT:-$ROOT/out/gpu-check}
mkdir -p "$OUTDIR"
log() { echo "gpu-check: $*" | tee -a "$OUTDIR/gpu-check.log" >&2; }

command -v nvidia-smi >/dev/null || { log "nvidia-smi not found: no NVIDIA driver here; nothing to check"; exit 1; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUTDIR/nvidia-smi.csv"

# ---- 1. CUDA ONNX Runtime -----------------------------------------------------------
ORT_GPU_VERSION=${ORT_GPU_VERSION:-1.31.1}
GPU_DIR=$ROOT/.deps/gpu
PY=${PYTHON:-python3}
if [[ ! -f $GPU_DIR/ok-$ORT_GPU_VERSION ]]; then
    log "installing onnxruntime-gpu $ORT_GPU_VERSION and the CUDA 12 / cuDNN 9 wheels into $GPU_DIR"
    rm -rf "$GPU_DIR.tmp" && mkdir -p "$GPU_DIR.tmp"
    PIP_ARGS=(--no-deps --target "$GPU_DIR.tmp/site")
    [[ -n ${NARRATOR_GPU_WHEELS:-} ]] && PIP_ARGS+=(--no-index --find-links "$NARRATOR_GPU_WHEELS")
    "$PY" -m pip install --quiet "${PIP_ARGS[@]}" \
        "onnxruntime-gpu==$ORT_GPU_VERSION" \
        nvidia-cuda-runtime-cu12 nvidia-cublas-cu12 nvidia-cudnn-cu12 \
        nvidia-cufft-cu12 nvidia-curand-cu12 nvidia-cuda-nvrtc-cu12 nvidia-nvjitlink-cu12
    rm -rf "$GPU_DIR" && mv "$GPU_DIR.tmp" "$GPU_DIR"
    touch "$GPU_DIR/ok-$ORT_GPU_VERSION"
fi
ORT_LIB=$(ls "$GPU_DIR"/site/onnxruntime/capi/libonnxruntime.so.* | sort | tail -1)
# The CUDA provider finds cuDNN/cuBLAS through the loader path.
LIBS=$(find "$GPU_DIR/site/nvidia" -maxdepth 2 -name lib -type d | tr '\n' ':')
export LD_LIBRARY_PATH="$LIBS$(dirname "$ORT_LIB"):${LD_LIBRARY_PATH:-}"
export NARRATOR_ONNXRUNTIME=$ORT_LIB

# ---- the binary ---------------------------------------------------------------------
BIN=${NARRATOR_BIN:-$ROOT/target/release/narrator}
if [[ ! -x $BIN ]]; then
    log "building narrator (release)"
    cargo build --release --locked -p narrator
fi

# ---- 2. doctor ----------------------------------------------------------------------
log "doctor"
"$BIN" doctor | tee "$OUTDIR/doctor.txt" || log "doctor reported errors (see doctor.txt)"
"$BIN" doctor --json > "$OUTDIR/doctor.json" || true

# ---- 3. calibration and plan --------------------------------------------------------
log "calibrating on $DEVICE"
"$BIN" plan --device "$DEVICE" --calibrate always | tee "$OUTDIR/plan.txt"
"$BIN" plan --device "$DEVICE" --json > "$OUTDIR/plan.json"
PLANNED=$(sed -n 's/.*"max_batch_requests":\([0-9]*\).*/\1/p' "$OUTDIR/plan.json" | head -1)

# ---- 4. batch 1 against the planned batch, same chapter, back to back -------------------
if [[ -z $BOOK ]]; then
    BOOK=$OUTDIR/chapter.txt
    # Chapter I of the corpus when it is beside the checkout, else the sample.
    if [[ -f $ROOT/../shared/corpus/alice29.txt ]]; then
        awk '/^[ \t]*CHAPTER I[ \t]*\r?$/{on=1} /^[ \t]*CHAPTER II[ \t]*\r?$/{exit} on' "$ROOT/../shared/corpus/alice29.txt" > "$BOOK"
    else
        cp "$ROOT/examples/sample.md" "$BOOK"
    fi
fi
run_one() { # $1 label, $2.. extra args; prints "label seconds audio_seconds"
    local label=$1; shift
    local dir=$OUTDIR/run-$label
    rm -rf "$dir"
    local t0 t1
    t0=$(date +%s.%N)
    "$BIN" run "$BOOK" --out "$dir" --format wav --json --device "$DEVICE" "$@" > "$OUTDIR/run-$label.json"
    t1=$(date +%s.%N)
    local audio
    audio=$(sed -n 's/.*"audio_seconds":\([0-9.]*\).*/\1/p' "$OUTDIR/run-$label.json" | head -1)
    awk -v l="$label" -v a="$t0" -v b="$t1" -v s="${audio:-0}" 'BEGIN { printf "%s %.3f %s\n", l, b - a, s }'
}
log "synthesizing $(basename "$BOOK"): batch 1, then the planned batch ($PLANNED)"
B1=$(run_one batch1 --max-batch 1)
BP=$(run_one planned)

# ---- 5. the table -------------------------------------------------------------------
{
    echo
    echo "| run | items per engine run | wall s | audio s | × realtime | vs batch 1 |"
    echo "|---|---|---|---|---|---|"
    read -r _ w1 a1 <<<"$B1"
    read -r _ wp ap <<<"$BP"
    awk -v w1="$w1" -v a1="$a1" -v wp="$wp" -v ap="$ap" -v n="$PLANNED" 'BEGIN {
        x1 = a1 / w1; xp = ap / wp
        printf "| batch 1 | 1 | %.2f | %.1f | %.1f | 1.00 |\n", w1, a1, x1
        printf "| planned | %s | %.2f | %.1f | %.1f | %.2f |\n", n, wp, ap, xp, xp / x1
    }'
    echo
    echo "calibration (engine only, from narrator plan):"
    grep -E '^\s+batch ' "$OUTDIR/plan.txt" || true
} | tee "$OUTDIR/table.md"
