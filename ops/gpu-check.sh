#!/usr/bin/env bash
# The one-shot GPU check, for the lent GPU machine (one H200, no network, no cargo, no
# pip; CUDA 13 / cuDNN 9 in its Python environment). docs/GPU.md has the call sequence.
#
#   bash ops/gpu-check.sh stage PART_FILE...      verify parts (sha256) and copy them to the
#                                                 stage folder, outside the work tree
#   bash ops/gpu-check.sh run [--quick] [--cpu] [--device cuda:N] [--budget SECONDS]
#   bash ops/gpu-check.sh status                  what is staged
#
# The parts come from `bash ops/gpu-bundle.sh` (.gpu-bundle/part-NN, each carried with
# .gpu-bundle/meta). `run` reassembles and unpacks them once (checking the whole stream's
# sha256), points narrator at the unpacked bundle and at the CUDA / cuDNN libraries of the
# device's Python (site-packages/nvidia/*/lib), then runs every step below under its own
# timeout; a failing step does not stop the others, and steps that no longer fit the time
# budget are skipped (recorded as such). Results are written to $STAGE/results and
# published into $OUT (default out/gpu-check) after every step as six files, since a call
# brings back at most 8: summary.txt, summary.json (one row per step: ok/failed/timeout/
# skipped, seconds, key figures; the targets), calibration.json (the GPU calibration to
# ship), env.txt (nvidia-smi, glibc, library folders, ldd), steps.tsv and results.tar.gz
# with everything:
#
#   doctor.json        narrator doctor --json
#   plan.json          narrator plan --calibrate always --json (calibration + plan)
#   book.json          narrator run alice29.txt --format wav --json on the GPU (the whole
#                      book; audio goes to a scratch folder and is deleted, only the
#                      manifest and a 15 s excerpt of chapter I are kept)
#   bench.json         narrator bench --json: batch 1, the batch sweep up to the plan, the
#                      concurrency search
#   oom.json           chapter I with --gpu-mem-limit-mib 600 --max-batch 64: must finish
#   parity-*.wav       one paragraph at noise 0 on the device and on the CPU, compared
#   kokoro-plan.json, kokoro-book.json, kokoro-bench.json   the Kokoro-82M family (voice
#                      af_heart) on the device: calibration and plan, chapter I, the bench
#                      (when the bundle carries Kokoro: ops/setup.sh --kokoro before bundling)
#   cpu-plan.json, cpu-book.json, cpu-bench.json    the same build with --device cpu
#   bench-pad1.json, bench-sessions2.json           levers (full mode only)
#   gpu-samples.csv    nvidia-smi utilization and memory every 0.5 s
#   *.log              each step's stderr; commands.txt the exact commands
#
# Targets (issue 4): batched throughput >= 4x batch 1 (bench); whole book >= 1,000x
# realtime on the GPU (stretch 3,000x).
#
# --quick   shorter: the CPU figure on chapter I instead of the book, a shorter bench,
#           no lever steps (budget 180 s instead of 360 s)
# --cpu     the rehearsal on a machine without a GPU: --device cpu everywhere, chapter I
#           instead of the book, tiny sweeps; the out-of-memory step uses narrator's test
#           hook (NARRATOR_TEST_GPU_MEMORY_TOKENS). Uses the bundle's CPU build of ONNX
#           Runtime when it has one (gpu-bundle.sh --with-cpu-ort), else the CUDA build on
#           the CPU.
# Environment: NARRATOR_GPU_STAGE (default $HOME/narrator-gpu), OUT, PYTHON (python3),
# NARRATOR_GPU_UNZSTD=cli|bundled|python (force a decompressor).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAGE=${NARRATOR_GPU_STAGE:-${HOME:-/tmp}/narrator-gpu}
PY=${PYTHON:-python3}

say() { printf 'gpu-check: %s\n' "$*" >&2; }
die() { printf 'gpu-check: ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

# The CUDA / cuDNN library folders of the device's Python (PyPI nvidia-* wheels:
# site-packages/nvidia/cu13/lib, nvidia/cudnn/lib, ...), colon-separated; empty if none.
nvidia_dirs() {
    "$PY" - 2>/dev/null <<'PY' || true
import glob, os, site, sys
roots = list(sys.path)
try:
    roots += site.getsitepackages() + [site.getusersitepackages()]
except Exception:
    pass
seen = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r or ".", "nvidia", "*", "lib"))):
        d = os.path.realpath(d)
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
print(":".join(seen))
PY
}

# What the first stage call can tell before all parts are here: whether the bundle's
# binaries can run on this glibc, how the stream will be decompressed, where CUDA is.
probe() {
    local tools=$STAGE/meta/tools need have dirs
    need=$(sed -n 's/^needs glibc >= \([0-9.]*\).*/\1/p' "$STAGE/meta/BUNDLE.txt" 2>/dev/null)
    have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
    say "probe: glibc ${have:-?} here, the bundle needs >= ${need:-?}$(
        [[ -n $have && -n $need ]] && [[ $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1) != "$need" ]] \
            && echo ' -- TOO OLD: narrator will not start; give the machine back')"
    if command -v zstd >/dev/null; then
        say "probe: zstd: $(command -v zstd)"
    elif env LD_LIBRARY_PATH="$tools" "$tools/zstd" --version >/dev/null 2>&1; then
        say "probe: zstd: none installed; the bundle's zstd runs"
    else
        say "probe: zstd: none installed and the bundle's does not run; trying python zstandard at run time"
    fi
    dirs=$(nvidia_dirs)
    say "probe: python $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>/dev/null || echo 'not found'); nvidia library folders: ${dirs:-none}"
    if command -v nvidia-smi >/dev/null; then
        say "probe: $(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -2 | paste -sd';' -)"
    else
        say "probe: no nvidia-smi"
    fi
    say "probe: $(df -h "$STAGE" | awk 'NR == 2 { print $4 " free in " $6 }')"
}

# ==== stage ================================================================================
staged_report() {
    [[ -f $STAGE/meta/parts.sha256 ]] || { say "nothing staged in $STAGE"; return 0; }
    local name have=() missing=()
    while read -r _ name; do
        if [[ -f $STAGE/parts/$name ]]; then have+=("$name"); else missing+=("$name"); fi
    done <"$STAGE/meta/parts.sha256"
    say "staged in $STAGE: ${#have[@]} of $((${#have[@]} + ${#missing[@]})) parts${missing:+; missing: ${missing[*]}}"
    [[ -f $STAGE/root/.unpacked ]] && say "unpacked bundle: $STAGE/root/narrator-gpu"
    return 0
}

stage() {
    (($#)) || die "stage: name the part files, e.g. bash ops/gpu-check.sh stage .gpu-bundle/part-00"
    local part meta name want got bundle
    for part in "$@"; do
        [[ -f $part ]] || die "stage: $part not found (carry it: carry [\".gpu-bundle/meta\", \"$part\"])"
        meta=$(dirname "$part")/meta
        [[ -f $meta/parts.sha256 && -f $meta/bundle.sha256 ]] \
            || die "stage: $meta/parts.sha256 is missing: carry .gpu-bundle/meta with every part"
        name=$(basename "$part")
        want=$(awk -v n="$name" '$2 == n { print $1 }' "$meta/parts.sha256")
        [[ -n $want ]] || die "stage: $name is not listed in $meta/parts.sha256"
        got=$(sha256sum "$part" | cut -d' ' -f1)
        [[ $got == "$want" ]] || die "stage: $name has sha256 $got, expected $want: damaged, carry it again"
        bundle=$(cut -d' ' -f1 "$meta/bundle.sha256")
        if [[ -f $STAGE/meta/bundle.sha256 && $(cut -d' ' -f1 "$STAGE/meta/bundle.sha256") != "$bundle" ]]; then
            say "stage: $STAGE held another bundle: replacing it"
            rm -rf "$STAGE/parts" "$STAGE/meta" "$STAGE/root"
        fi
        mkdir -p "$STAGE/parts"
        if [[ ! -f $STAGE/meta/bundle.sha256 ]]; then
            rm -rf "$STAGE/meta.tmp"
            cp -R "$meta" "$STAGE/meta.tmp"
            mv "$STAGE/meta.tmp" "$STAGE/meta"
            probe
        fi
        cp "$part" "$STAGE/parts/.$name.tmp"
        mv -f "$STAGE/parts/.$name.tmp" "$STAGE/parts/$name"
        say "staged $name ($(du -h "$part" | cut -f1), sha256 ok)"
    done
    staged_report
}

# ==== unpack ===============================================================================
# Sets UNZSTD to a command that decompresses stdin to stdout.
pick_decompressor() {
    local want=${NARRATOR_GPU_UNZSTD:-}
    local tools=$STAGE/meta/tools
    if [[ -z $want || $want == cli ]] && command -v zstd >/dev/null; then
        UNZSTD=(zstd -q -dc --long=27); UNZSTD_NAME="zstd ($(command -v zstd))"; return 0
    fi
    if [[ -z $want || $want == bundled ]] && [[ -x $tools/zstd ]] \
        && env LD_LIBRARY_PATH="$tools" "$tools/zstd" --version >/dev/null 2>&1; then
        UNZSTD=(env LD_LIBRARY_PATH="$tools" "$tools/zstd" -q -dc --long=27); UNZSTD_NAME="the bundle's zstd"; return 0
    fi
    if [[ -z $want || $want == python ]] && "$PY" -c 'import zstandard' 2>/dev/null; then
        UNZSTD=("$PY" -c 'import sys, zstandard; zstandard.ZstdDecompressor(max_window_size=1 << 27).copy_stream(sys.stdin.buffer, sys.stdout.buffer)')
        UNZSTD_NAME="python zstandard"; return 0
    fi
    if [[ -z $want || $want == python ]] && "$PY" -c 'from compression import zstd' 2>/dev/null; then
        UNZSTD=("$PY" -c '
import sys
from compression import zstd
d = zstd.ZstdDecompressor()
while True:
    b = sys.stdin.buffer.read(1 << 20)
    if not b:
        break
    while b:
        sys.stdout.buffer.write(d.decompress(b))
        if d.eof:
            b, d = d.unused_data, zstd.ZstdDecompressor()
        else:
            b = b""
')
        UNZSTD_NAME="python compression.zstd"; return 0
    fi
    die "no zstd decompressor: no zstd command, the bundle's zstd does not run here, no python zstandard"
}

unpack() {
    [[ -f $STAGE/meta/bundle.sha256 ]] \
        || die "nothing staged in $STAGE: run \`bash ops/gpu-check.sh stage .gpu-bundle/part-NN\` for each part first (docs/GPU.md)"
    local bundle name missing=() parts=()
    bundle=$(cut -d' ' -f1 "$STAGE/meta/bundle.sha256")
    if [[ -f $STAGE/root/.unpacked && $(cat "$STAGE/root/.unpacked") == "$bundle" ]]; then
        say "bundle ${bundle:0:12} already unpacked in $STAGE/root"
        return 0
    fi
    while read -r _ name; do
        if [[ -f $STAGE/parts/$name ]]; then parts+=("$STAGE/parts/$name"); else missing+=("$name"); fi
    done <"$STAGE/meta/parts.sha256"
    ((${#missing[@]} == 0)) || die "parts not staged: ${missing[*]} (stage each: bash ops/gpu-check.sh stage .gpu-bundle/PART)"
    local got
    got=$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)
    [[ $got == "$bundle" ]] || die "the staged parts concatenate to sha256 $got, expected $bundle: stage them again"
    pick_decompressor
    say "unpacking ${#parts[@]} parts with $UNZSTD_NAME into $STAGE/root"
    rm -rf "$STAGE/root.tmp"
    mkdir -p "$STAGE/root.tmp"
    cat "${parts[@]}" | "${UNZSTD[@]}" | tar -x -C "$STAGE/root.tmp" \
        || { rm -rf "$STAGE/root.tmp"; die "unpacking failed"; }
    echo "$bundle" >"$STAGE/root.tmp/.unpacked"
    rm -rf "$STAGE/root"
    mv "$STAGE/root.tmp" "$STAGE/root"
}

# ==== run ==================================================================================
SAMPLER=""
stop_sampler() {
    if [[ -n $SAMPLER ]]; then
        kill "$SAMPLER" 2>/dev/null || true
        wait "$SAMPLER" 2>/dev/null || true
    fi
    SAMPLER=""
}
trap stop_sampler EXIT
CPU_MODE=0
QUICK=0
GPU_DEV=cuda:0
BUDGET=""

budget_left() { # whole seconds of the run's budget left
    awk -v a="$RUN_T0" -v b="$(now)" -v t="$BUDGET" 'BEGIN { printf "%d", t - (b - a) }'
}

# One step: run_step NAME MAX_SECONDS STDOUT_FILE CMD...; records NAME, status, rc,
# seconds, start and end in steps.tsv. Never fails the script.
run_step() {
    local name=$1 max=$2 outfile=$3
    shift 3
    local t0 elapsed left t rc status
    t0=$(now)
    elapsed=$(awk -v a="$RUN_T0" -v b="$t0" 'BEGIN { printf "%d", b - a }')
    left=$((BUDGET - elapsed - 10))
    if ((left < 15)); then
        say "[$name] skipped: the time budget (${BUDGET}s) is spent"
        printf '%s\tskipped\t-\t0\t%s\t%s\t%s\n' "$name" "$t0" "$t0" "$outfile" >>"$RES/steps.tsv"
        return 0
    fi
    t=$max
    ((t > left)) && t=$left
    printf '[%s] timeout %ss: %s\n' "$name" "$t" "$*" >>"$RES/commands.txt"
    say "[$name] (at most ${t}s) $(shown "$@")"
    set +e
    (cd "$WORK" && timeout -k 10 "$t" "$@") >"$RES/$outfile" 2>"$RES/$name.log"
    rc=$?
    set -e
    case $rc in
        0) status=ok ;;
        124 | 137) status=timeout ;;
        *) status=failed ;;
    esac
    local t1
    t1=$(now)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" "$t0" "$t1" "$outfile" >>"$RES/steps.tsv"
    say "[$name] $status (rc $rc) in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s"
    publish
    return 0
}

# Copies the results into $OUT as at most 6 files: summary.txt, summary.json,
# calibration.json, env.txt, steps.tsv and results.tar.gz (everything, logs included).
# Called after every step, so a call killed at its limit still brings back what ran.
publish() {
    local f
    for f in summary.txt summary.json calibration.json env.txt steps.tsv; do
        [[ -f $RES/$f ]] && cp -f "$RES/$f" "$PUB/$f"
    done
    tar -czf "$PUB/.results.tar.gz" -C "$RES" . 2>/dev/null && mv -f "$PUB/.results.tar.gz" "$PUB/results.tar.gz"
    return 0
}

shown() { # a command without the env prefix and folders, for the log
    local a out=()
    for a in "$@"; do
        [[ $a == env || $a == LD_LIBRARY_PATH=* ]] && continue
        out+=("${a##*/}")
    done
    printf '%s' "${out[*]}"
}

skip_step() { # NAME WHY
    printf '%s\tskipped\t-\t0\t%s\t%s\t%s\n' "$1" "$(now)" "$(now)" "$2" >>"$RES/steps.tsv"
}

# Copies a run's manifest and a 15-second excerpt of its first chapter out of the scratch
# folder, with simple audio statistics, then deletes the audio (a whole book in WAV is
# about 1 GB: it must not come back in $OUT).
keep_audio_facts() { # STEP DIR
    local step=$1 dir=$2
    [[ -f $dir/manifest.json ]] && cp "$dir/manifest.json" "$RES/$step-manifest.json"
    "$PY" - "$dir" "$RES/$step-excerpt.wav" "$RES/$step-audio.json" <<'PY' || true
import json, math, os, sys, wave, array
d, excerpt, stats_out = sys.argv[1:4]
try:
    m = json.load(open(os.path.join(d, "manifest.json")))
    first = os.path.join(d, m["chapters"][0]["file"])
except Exception as e:  # no manifest: the run failed
    json.dump({"error": str(e)}, open(stats_out, "w"))
    sys.exit(0)
with wave.open(first, "rb") as w:
    rate, width, ch = w.getframerate(), w.getsampwidth(), w.getnchannels()
    frames = w.readframes(w.getnframes())
    n = w.getnframes()
a = array.array("h", frames[: 60 * rate * width * ch]) if width == 2 else array.array("h")
peak = max((abs(x) for x in a), default=0)
rms = math.sqrt(sum(x * x for x in a) / len(a)) if a else 0.0
clipped = sum(1 for x in a if abs(x) >= 32767) / max(len(a), 1)
silent = sum(1 for x in a if abs(x) < 33) / max(len(a), 1)
with wave.open(excerpt, "wb") as o:
    o.setnchannels(ch); o.setsampwidth(width); o.setframerate(rate)
    o.writeframes(frames[: 15 * rate * width * ch])
json.dump({"file": m["chapters"][0]["file"], "seconds": n / rate, "rate": rate, "stats_over_seconds": len(a) / rate / ch,
           "peak": peak, "rms": round(rms, 1), "clipped_fraction": clipped,
           "near_silent_fraction": round(silent, 4)}, open(stats_out, "w"), indent=1)
PY
    rm -rf "$dir"
}

run_check() {
    while (($#)); do
        case "$1" in
            --cpu) CPU_MODE=1; shift ;;
            --quick) QUICK=1; shift ;;
            --device) GPU_DEV=${2:?--device needs cuda:N}; shift 2 ;;
            --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
            -h | --help) usage; exit 0 ;;
            *) die "run: unknown option '$1' (--quick, --cpu, --device cuda:N, --budget SECONDS)" ;;
        esac
    done
    if [[ -z $BUDGET ]]; then
        if ((CPU_MODE)); then BUDGET=900; elif ((QUICK)); then BUDGET=180; else BUDGET=360; fi
    fi
    [[ $BUDGET =~ ^[0-9]+$ ]] || die "--budget: whole seconds"
    PUB=${OUT:-$ROOT/out/gpu-check}
    mkdir -p "$PUB"
    PUB=$(cd "$PUB" && pwd)
    RUN_T0=$(now)
    unpack
    # Results are written outside $OUT and published after every step (publish): $OUT
    # brings back at most 8 files.
    RES=$STAGE/results
    rm -rf "$RES"
    mkdir -p "$RES"

    local R=$STAGE/root/narrator-gpu
    local BIN=$R/bin/narrator DATA=$R/deps
    [[ -x $BIN ]] || die "the bundle has no bin/narrator: rebuild it with ops/gpu-bundle.sh"
    local ORT_LIB ORT_NOTE
    ORT_LIB=$(find "$DATA/onnxruntime-gpu" -maxdepth 1 -type f -name 'libonnxruntime.so.*' | sort | tail -1)
    ORT_NOTE="CUDA build"
    if ((CPU_MODE)) && compgen -G "$DATA/onnxruntime/libonnxruntime.so.*" >/dev/null; then
        ORT_LIB=$(find "$DATA/onnxruntime" -maxdepth 1 -type f -name 'libonnxruntime.so.*' | sort | tail -1)
        ORT_NOTE="CPU build"
    fi
    [[ -n $ORT_LIB ]] || die "the bundle has no ONNX Runtime library"

    # The CUDA / cuDNN libraries of the device's Python (PyPI nvidia-* wheels).
    local NV_DIRS
    NV_DIRS=$(nvidia_dirs)
    export NARRATOR_DATA_DIR=$DATA NARRATOR_VOICES_DIR=$DATA/voices NARRATOR_ONNXRUNTIME=$ORT_LIB
    [[ -n $NV_DIRS ]] && export NARRATOR_CUDA_LIBS=$NV_DIRS
    local NLD
    NLD="$R/lib:$(dirname "$ORT_LIB")${NV_DIRS:+:$NV_DIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    local NAR=(env "LD_LIBRARY_PATH=$NLD" "$BIN")

    WORK=$STAGE/work
    local SCR=$STAGE/scratch
    rm -rf "$WORK" "$SCR"
    mkdir -p "$WORK" "$SCR"

    # Inputs: the whole book, chapter I, a few paragraphs, one paragraph.
    local BOOK=$R/corpus/alice29.txt CH1=$WORK/chapter1.txt EXCERPT=$WORK/excerpt.txt PARA=$WORK/paragraph.txt
    awk '{ sub(/\r$/, "") } /^[ \t]*CHAPTER I[ \t]*$/ { on = 1 } /^[ \t]*CHAPTER II[ \t]*$/ { exit } on' "$BOOK" >"$CH1"
    [[ -s $CH1 ]] || cp "$BOOK" "$CH1"
    head -n 40 "$CH1" >"$EXCERPT"
    # The first paragraph of the chapter body (after the two title lines).
    awk 'NR > 3 && /[a-z]/ { p = 1 } p && /^[ \t]*$/ { exit } p' "$CH1" >"$PARA"

    local DEV MODE_NAME
    if ((CPU_MODE)); then DEV=cpu; MODE_NAME="cpu rehearsal"; elif ((QUICK)); then DEV=$GPU_DEV; MODE_NAME="gpu quick"; else DEV=$GPU_DEV; MODE_NAME="gpu full"; fi
    say "mode: $MODE_NAME, device $DEV, ONNX Runtime $(basename "$ORT_LIB") ($ORT_NOTE), budget ${BUDGET}s, out $PUB"

    # ---- env ---------------------------------------------------------------------------
    {
        echo "mode: $MODE_NAME; device: $DEV; budget: ${BUDGET}s"
        echo "bundle:"; sed -n '1,8p' "$STAGE/meta/BUNDLE.txt" | sed 's/^/  /'
        echo "host: $(hostname) $(uname -r); cores: $(nproc); memory: $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
        echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>/dev/null | head -1)"
        echo "python: $("$PY" --version 2>&1 || echo none) at $(command -v "$PY" || echo -)"
        echo "onnxruntime: $ORT_LIB ($ORT_NOTE)"
        echo "nvidia library folders (NARRATOR_CUDA_LIBS): ${NV_DIRS:-none found}"
        echo "LD_LIBRARY_PATH for narrator: $NLD"
        echo "libcuda: $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / { print $NF; exit }')"
        if command -v nvidia-smi >/dev/null; then
            echo "--- nvidia-smi"
            timeout 30 nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,persistence_mode,power.limit,clocks.max.sm,pcie.link.gen.current --format=csv 2>&1 || true
            timeout 30 nvidia-smi 2>&1 | head -20 || true
        else
            echo "nvidia-smi: not found"
        fi
        echo "--- ldd narrator (with the bundle's libraries)"
        env "LD_LIBRARY_PATH=$NLD" ldd "$BIN" 2>&1 || true
        echo "--- narrator --version"
        "${NAR[@]}" --version 2>&1 || true
    } >"$RES/env.txt" 2>&1
    publish
    if ! "${NAR[@]}" --version >/dev/null 2>&1; then
        say "narrator does not start here: see $RES/env.txt (ldd, glibc)"
    fi
    ((CPU_MODE)) || command -v nvidia-smi >/dev/null || say "no nvidia-smi: the GPU steps will fail (use --cpu for the rehearsal)"

    # GPU utilization and memory every 0.5 s while the steps run.
    SAMPLER=""
    if command -v nvidia-smi >/dev/null && ((!CPU_MODE)); then
        nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 \
            >"$RES/gpu-samples.csv" 2>/dev/null &
        SAMPLER=$!
    fi

    # ---- the steps, most important first --------------------------------------------------
    local CPU=(--device cpu --ort-build cpu)
    local PLAN_BATCH=""
    run_step doctor 60 doctor.json "${NAR[@]}" doctor --json
    run_step plan 150 plan.json "${NAR[@]}" plan --device "$DEV" --calibrate always --json
    PLAN_BATCH=$(sed -n 's/.*"max_batch_requests":\([0-9]*\).*/\1/p' "$RES/plan.json" | head -1)
    "$PY" -c 'import json, sys
v = json.loads(open(sys.argv[1]).readline())
json.dump(v["calibration_full"], open(sys.argv[2], "w"), indent=2)' "$RES/plan.json" "$RES/calibration.json" 2>/dev/null \
        || rm -f "$RES/calibration.json"

    if ((CPU_MODE)); then
        run_step book 300 book.json "${NAR[@]}" run "$CH1" --out "$SCR/book" --format wav --chapter-files --json --device "$DEV"
    else
        run_step book 240 book.json "${NAR[@]}" run "$BOOK" --out "$SCR/book" --format wav --chapter-files --json --device "$DEV"
    fi
    keep_audio_facts book "$SCR/book"

    # The second model family: batch-1 graph, sentences packed into runs of up to 510 ids.
    if [[ -f $DATA/voices/kokoro/model.onnx ]]; then
        run_step kokoro-plan 120 kokoro-plan.json "${NAR[@]}" plan --voice af_heart --device "$DEV" --calibrate always --json
        run_step kokoro-book 240 kokoro-book.json "${NAR[@]}" run "$CH1" --voice af_heart --out "$SCR/kokoro-book" \
            --format wav --json --device "$DEV"
        run_step kokoro-bench 90 kokoro-bench.json "${NAR[@]}" bench --voice af_heart --device "$DEV" --json \
            --seconds 0.5 --batches 1,4 --max-concurrency 16
    else
        skip_step kokoro-plan "the bundle carries no Kokoro (ops/setup.sh --kokoro, then ops/gpu-bundle.sh)"
    fi

    if ((CPU_MODE)); then
        run_step bench 240 bench.json "${NAR[@]}" bench --device "$DEV" --json --seconds 0.3 --batches 1,2 --max-concurrency 2
    elif ((QUICK)); then
        run_step bench 90 bench.json "${NAR[@]}" bench --device "$DEV" --json --seconds 0.5 --max-concurrency 128
    else
        run_step bench 150 bench.json "${NAR[@]}" bench --device "$DEV" --json --seconds 1 --max-concurrency 512
    fi

    # Out of memory on purpose: the job must still complete (halving, or CPU fallback).
    if ((CPU_MODE)); then
        run_step oom 240 oom.json env NARRATOR_TEST_GPU_MEMORY_TOKENS=600 "${NAR[@]}" run "$EXCERPT" --out "$SCR/oom" \
            --format wav --json --device cpu --max-batch 8 --gpu-mem-limit-mib 600
    else
        run_step oom 120 oom.json "${NAR[@]}" run "$CH1" --out "$SCR/oom" --format wav --json --device "$DEV" \
            --gpu-mem-limit-mib 600 --max-batch 64
    fi
    rm -rf "$SCR/oom"

    # The same paragraph at noise 0 on the device and on the CPU: the audio must agree.
    run_step parity-device 60 parity-device.out "${NAR[@]}" synth "$PARA" -o "$RES/parity-device.wav" \
        --device "$DEV" --noise-scale 0 --noise-w 0
    run_step parity-cpu 90 parity-cpu.out "${NAR[@]}" synth "$PARA" -o "$RES/parity-cpu.wav" \
        "${CPU[@]}" --noise-scale 0 --noise-w 0

    # CPU-only figures with the same build.
    if ((QUICK)); then
        skip_step cpu-plan "quick mode: the CPU run uses the default layout"
    else
        run_step cpu-plan 90 cpu-plan.json "${NAR[@]}" plan "${CPU[@]}" --calibrate always --json
    fi
    if ((CPU_MODE)); then
        run_step cpu-book 240 cpu-book.json "${NAR[@]}" run "$EXCERPT" --out "$SCR/cpu-book" --format wav --chapter-files --json "${CPU[@]}"
    elif ((QUICK)); then
        run_step cpu-book 90 cpu-book.json "${NAR[@]}" run "$CH1" --out "$SCR/cpu-book" --format wav --chapter-files --json "${CPU[@]}"
    elif (($(budget_left) >= 220)); then
        run_step cpu-book 200 cpu-book.json "${NAR[@]}" run "$BOOK" --out "$SCR/cpu-book" --format wav --chapter-files --json "${CPU[@]}"
    else
        say "[cpu-book] chapter I instead of the book: $(budget_left) s of the budget left"
        run_step cpu-book 90 cpu-book.json "${NAR[@]}" run "$CH1" --out "$SCR/cpu-book" --format wav --chapter-files --json "${CPU[@]}"
    fi
    keep_audio_facts cpu-book "$SCR/cpu-book"

    # Levers (full GPU mode, and the rehearsal with tiny sweeps): cuDNN re-planning per
    # shape (--pad-to 1 against the default 16), two sessions on one GPU, the CPU bench.
    local PB=${PLAN_BATCH:-1}
    if ((QUICK)); then
        skip_step bench-pad1 "quick mode"
        skip_step bench-sessions2 "quick mode"
        skip_step cpu-bench "quick mode"
    elif ((CPU_MODE)); then
        run_step bench-pad1 120 bench-pad1.json "${NAR[@]}" bench --device "$DEV" --json --seconds 0.3 --batches 2 \
            --max-concurrency 1 --pad-to 1
        run_step bench-sessions2 120 bench-sessions2.json "${NAR[@]}" bench --device "$DEV" --json --seconds 0.3 \
            --batches 1 --max-concurrency 2 --sessions 2 --intra-threads 1 --calibrate cached
        run_step cpu-bench 120 cpu-bench.json "${NAR[@]}" bench "${CPU[@]}" --json --seconds 0.3 --batches 1,2 --max-concurrency 2
    else
        run_step bench-pad1 90 bench-pad1.json "${NAR[@]}" bench --device "$DEV" --json --seconds 1 --batches "1,$PB" \
            --max-concurrency 1 --pad-to 1
        run_step bench-sessions2 90 bench-sessions2.json "${NAR[@]}" bench --device "$DEV" --json --seconds 1 \
            --batches "$PB" --max-concurrency 256 --sessions 2 --max-batch "$PB" --calibrate cached
        run_step cpu-bench 90 cpu-bench.json "${NAR[@]}" bench "${CPU[@]}" --json --seconds 1 --batches 1,4 --max-concurrency 64
    fi
    stop_sampler
    rm -rf "$SCR"

    # ---- summary ------------------------------------------------------------------------
    local total
    total=$(awk -v a="$RUN_T0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    summarize "$MODE_NAME" "$DEV" "$total" || say "the summary failed (python3?): the raw steps are in steps.tsv"
    publish
    say "results in $PUB: $(find "$PUB" -maxdepth 1 -type f -printf '%f ')"
    cat "$RES/summary.txt" 2>/dev/null || cat "$RES/steps.tsv"
}

summarize() { # MODE DEVICE TOTAL_SECONDS
    "$PY" - "$RES" "$1" "$2" "$3" "$BUDGET" <<'PY'
import csv, datetime, json, math, os, re, sys, wave, array

out, mode, device, total, budget = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])

def load(name, lines=False):
    p = os.path.join(out, name)
    try:
        text = open(p).read()
        if lines:
            return [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")]
        return json.loads(text)
    except Exception:
        return None

def log_lines(step):  # without terminal colours
    try:
        text = open(os.path.join(out, step + ".log"), errors="replace").read()
    except OSError:
        return []
    return re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()

def last_error(step):
    lines = [l.strip() for l in log_lines(step) if l.strip()]
    for l in lines:  # the first line that says error, else the last line
        if re.search(r"\berror\b", l, re.I) and "WARN" not in l[:40]:
            return l[:200]
    return lines[-1][:200] if lines else ""

steps = []
with open(os.path.join(out, "steps.tsv")) as f:
    for row in csv.reader(f, delimiter="\t"):
        name, status, rc, secs, t0, t1, outfile = row
        steps.append(dict(name=name, status=status, rc=rc, seconds=float(secs), start=float(t0),
                          end=float(t1), output=outfile, figures={}))
by = {s["name"]: s for s in steps}

# GPU samples: the busiest moment of each step.
samples = []
try:
    for row in csv.reader(open(os.path.join(out, "gpu-samples.csv"))):
        ts = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((ts, int(row[1]), float(row[2]), float(row[3])))
except Exception:
    pass
for s in steps:
    w = [x for x in samples if s["start"] <= x[0] <= s["end"]]
    if w:
        s["figures"]["gpu_util_max_pct"] = max(x[2] for x in w)
        s["figures"]["gpu_util_mean_pct"] = round(sum(x[2] for x in w) / len(w), 1)
        s["figures"]["gpu_mem_max_mib"] = max(x[3] for x in w)

def xrt_of_run(step):
    s = by.get(step)
    v = load(step + ".json")
    if not s or not v:
        return None
    f = s["figures"]
    f["audio_seconds"] = round(v.get("audio_seconds", 0), 1)
    f["wall_seconds"] = round(v.get("wall_seconds", 0), 2)
    f["x_realtime"] = round(v.get("x_realtime", 0), 1)
    # Process wall: start-up (runtime, CUDA context, session) included.
    if s["seconds"] > 0:
        f["x_realtime_process"] = round(v.get("audio_seconds", 0) / s["seconds"], 1)
    f["segments"] = v.get("segments")
    if v.get("warnings"):
        f["warnings"] = len(v["warnings"])
    a = load(step + "-audio.json")
    if a and "peak" in a:
        f["chapter1_peak"] = a["peak"]
        f["chapter1_near_silent"] = a["near_silent_fraction"]
    return f["x_realtime"]

d = load("doctor.json")
if d is not None and "doctor" in by:
    findings = d.get("findings") or []
    errs = [x for x in findings if str(x.get("severity", "")).lower() == "error"]
    warns = [x for x in findings if str(x.get("severity", "")).lower() == "warning"]
    by["doctor"]["figures"].update(errors=len(errs), warnings=len(warns),
                                   gpus=len(d.get("gpus") or []))
    if errs:
        by["doctor"]["figures"]["first_error"] = errs[0].get("measured", "")[:120]

def plan_figures(step):
    v = load(step + ".json", lines=True)
    if not v or step not in by:
        return None
    p = v[0]
    f = by[step]["figures"]
    f.update(device=p.get("device"), model=p.get("device_model"), batch=p.get("max_batch_requests"),
             tokens=p.get("max_batch_tokens"), sessions=p.get("sessions"), threads=p.get("intra_threads"))
    if p.get("device_fallback"):
        f["device_fallback"] = p["device_fallback"]
    c = p.get("calibration_full") or {}
    pts = c.get("points") or []
    if pts:
        best = max(pts, key=lambda q: q["audio_seconds"] / q["seconds"] if q["seconds"] else 0)
        one = [q for q in pts if q["batch"] == 1]
        f["calib_best_x"] = round(best["audio_seconds"] / best["seconds"], 1) if best["seconds"] else None
        f["calib_best_batch"] = best["batch"]
        if one and one[0]["seconds"]:
            f["calib_batch1_x"] = round(one[0]["audio_seconds"] / one[0]["seconds"], 1)
        f["calib_seconds"] = round(c.get("seconds", 0), 1)
        f["bytes_per_token"] = round(c.get("bytes_per_token", 0))
    return p

def bench_figures(step):
    v = load(step + ".json")
    if not v or step not in by:
        return None
    f = by[step]["figures"]
    rs, rb = v.get("rtf_single") or 0, v.get("rtf_batched") or 0
    f["batch1_x"] = round(1 / rs, 1) if rs else None
    f["batched_x"] = round(1 / rb, 1) if rb else None
    f["batched_at"] = v.get("batched_at")
    sweep = v.get("batch_sweep") or []
    if sweep:
        best = max(sweep, key=lambda q: q["throughput"])
        b1 = [q for q in sweep if q["batch"] == 1]
        f["best_x"], f["best_batch"] = round(best["throughput"], 1), best["batch"]
        if b1 and b1[0]["throughput"]:
            f["best_vs_batch1"] = round(best["throughput"] / b1[0]["throughput"], 2)
        f["sweep"] = {str(q["batch"]): round(q["throughput"], 1) for q in sweep}
    if rs and rb:
        f["batched_vs_single"] = round(rs / rb, 2)
    conc = v.get("concurrency") or []
    if conc:
        f["max_stable_concurrency"] = v.get("max_stable_concurrency")
        f["concurrency_best_x"] = round(max(q["throughput"] for q in conc), 1)
    return v

plan = plan_figures("plan")
plan_figures("cpu-plan")
gpu_x = xrt_of_run("book")
cpu_x = xrt_of_run("cpu-book")
xrt_of_run("oom")
bench = bench_figures("bench")
for b in ("bench-pad1", "bench-sessions2", "cpu-bench"):
    bench_figures(b)

if "oom" in by:
    lines = log_lines("oom")
    f = by["oom"]["figures"]
    f["oom_events"] = sum(1 for l in lines if "out of memory" in l.lower())
    f["fell_back_to_cpu"] = sum(1 for l in lines if re.search(r"\b(fell|falls?|falling) back\b", l, re.I))
    f["completed"] = by["oom"]["status"] == "ok" and load("oom.json") is not None

# Parity: the paragraph on the device against the CPU (noise 0).
def read_wav(p):
    with wave.open(p, "rb") as w:
        return w.getframerate(), array.array("h", w.readframes(w.getnframes()))
if "parity-cpu" in by:
    f = by["parity-cpu"]["figures"]
    try:
        ra, a = read_wav(os.path.join(out, "parity-device.wav"))
        rb_, b = read_wav(os.path.join(out, "parity-cpu.wav"))
        n = min(len(a), len(b))
        diff = [a[i] - b[i] for i in range(n)]
        sig = sum(x * x for x in b[:n]) / max(n, 1)
        err = sum(x * x for x in diff) / max(n, 1)
        f.update(device_samples=len(a), cpu_samples=len(b), max_abs_diff=max((abs(x) for x in diff), default=0),
                 snr_db=(round(10 * math.log10(sig / err), 1) if err > 0 else "identical"))
    except Exception as e:
        f["compare_error"] = str(e)[:100]

for s in steps:
    if s["status"] in ("failed", "timeout"):
        s["figures"]["error"] = last_error(s["name"])

targets = {}
if bench and bench.get("rtf_single") and bench.get("rtf_batched"):
    r = bench["rtf_single"] / bench["rtf_batched"]
    targets["batched_vs_batch1"] = dict(value=round(r, 2), target=4, met=r >= 4,
        what=f"bench: batch {bench.get('batched_at')} throughput / batch 1")
if gpu_x is not None:
    targets["book_x_realtime"] = dict(value=gpu_x, target=1000, stretch=3000, met=gpu_x >= 1000,
        stretch_met=gpu_x >= 3000, what=f"whole run on {device} (narrator's wall)")
if gpu_x and cpu_x:
    targets["device_vs_cpu"] = dict(value=round(gpu_x / cpu_x, 1), what="x realtime on the device / on the CPU (same build)")

summary = dict(mode=mode, device=device, budget_seconds=budget, total_seconds=total,
               written=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               steps=steps, targets=targets)
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)

def fig(f):
    keep = []
    for k, v in f.items():
        if k in ("sweep",):
            keep.append("sweep " + " ".join(f"{b}:{x}" for b, x in v.items()))
        elif k == "error":
            continue
        else:
            keep.append(f"{k}={v}")
    return ", ".join(keep)

rows = [f"narrator GPU check: {mode}, device {device}, {total:.0f} s of a {budget} s budget", "",
        "| step | status | s | figures |", "|---|---|---|---|"]
for s in steps:
    note = fig(s["figures"])
    if s["figures"].get("error"):
        note = (note + "; " if note else "") + "error: " + s["figures"]["error"]
    if s["status"] == "skipped" and s["output"] and not s["output"].endswith(".json"):
        note = s["output"]
    rows.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {note} |")
rows += ["", "targets:"]
if not targets:
    rows.append("  (none measured)")
for k, t in targets.items():
    mark = "" if "met" not in t else (" MET" if t["met"] else " NOT met")
    extra = f" (target {t['target']}" + (f", stretch {t['stretch']}" if "stretch" in t else "") + ")" if "target" in t else ""
    rows.append(f"  {k}: {t['value']}{extra}{mark}: {t['what']}")
open(os.path.join(out, "summary.txt"), "w").write("\n".join(rows) + "\n")
PY
}

# ==== main =================================================================================
cmd=${1:-}
(($#)) && shift
case "$cmd" in
    stage) stage "$@" ;;
    run) run_check "$@" ;;
    status) staged_report ;;
    -h | --help | help) usage ;;
    "") usage; exit 2 ;;
    *) die "unknown command '$cmd' (stage, run, status; --help)" ;;
esac
