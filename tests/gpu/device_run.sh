#!/bin/bash
# One call on a GPU machine (no TensorFlow needed): build _cuda, then the stages named as
# arguments, each bounded in time, logs under $OUT (default ./gpu_out):
#   test       the GPU tests (tests/gpu), in parallel (TEST_N workers, default 8)
#   sanitize   compute-sanitizer memcheck, racecheck and synccheck over tests/gpu/sanitize_run.py
#              (SAN_CASES: its --cases; SAN_ARGS: further options; TOOLS: which of the three;
#              SAN_S: seconds each)
#   steps      benchmarks/gpu/fft_steps.py: the FFT path's steps, timed and profiled, with the
#              cost model's terms, JSON in $OUT/fft_steps.json (STEPS_CASES: its --cases)
#   bench      benchmarks/gpu/bench.py, every algorithm, JSON in $OUT/bench_gpu.json
#              (BENCH_CASES, BENCH_ARGS: its --cases and further options)
# Run from the repository root, e.g.  OUT=/tmp/gpu bash tests/gpu/device_run.sh test sanitize bench
# The runs worth keeping go to benchmarks/results/gpu/.
OUT=${OUT:-gpu_out}
PY=${PY:-python3}
mkdir -p "$OUT"
stage() { echo "=== $1 ($(date +%T))"; }
stage env
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc --version | tail -1
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
stage build
if ! make cuda PY="$PY" JOBS=16 >"$OUT/build.log" 2>&1; then tail -60 "$OUT/build.log"; exit 1; fi
for s in "$@"; do
  case $s in
  test)
    stage test
    LARGECONV_REQUIRE_GPU=1 timeout "${TEST_S:-240}" $PY -m pytest -q -rs -p no:cacheprovider \
      -n "${TEST_N:-8}" --timeout 200 tests/gpu >"$OUT/test.log" 2>&1
    echo "rc=$?"; grep -E "passed|failed|error" "$OUT/test.log" | tail -3
    grep -E "^(FAILED|ERROR)" "$OUT/test.log" | head -40 ;;
  sanitize)
    for tool in ${TOOLS:-memcheck racecheck synccheck}; do
      stage "$tool"
      timeout "${SAN_S:-150}" compute-sanitizer --tool $tool --kernel-name kns=largeconv \
        --error-exitcode 9 --print-limit 20 $PY tests/gpu/sanitize_run.py ${SAN_CASES:+--cases $SAN_CASES} $SAN_ARGS \
        >"$OUT/$tool.log" 2>&1
      echo "rc=$?"; tail -4 "$OUT/$tool.log"; grep -E "Invalid|Hazard|Barrier|Error" "$OUT/$tool.log" | head -6
    done ;;
  steps)
    stage steps
    timeout "${STEPS_S:-240}" $PY -m benchmarks.gpu.fft_steps --json "$OUT/fft_steps.json" \
      ${STEPS_CASES:+--cases $STEPS_CASES} 2>&1 | tee "$OUT/steps.log" ;;
  bench)
    stage bench
    timeout "${BENCH_S:-240}" $PY -m benchmarks.gpu.bench --algorithms auto direct fft \
      --json "$OUT/bench_gpu.json" ${BENCH_CASES:+--cases $BENCH_CASES} $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" ;;
  esac
done
stage done
