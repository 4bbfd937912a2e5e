#!/usr/bin/env bash
# One script for a GPU machine (at most about 8 minutes): everything a CPU-only CI cannot check.
#
#   bash benchmarks/gpu.sh [OUT_DIR]          # default reports/gpu/
#
# 1. our Triton kernel's tests, compiled for this GPU (production shapes included), then each
#    float64 kernel emulation (pytest_mla/kernels/emulated) beside the real library kernel on the
#    same inputs (tests marked gpu_emulation; a library not installed here is a skip, named in the log);
# 2. matrix/reference.toml on the built-in engine for this host's arch: every accepted
#    cell whose backend has a kernel here runs it (our Triton kernel; FlashMLA /
#    FlashInfer MLA / TRT-LLM MLA through their wrappers where installed);
# 3. matrix/sglang.toml and matrix/vllm.toml where those engines import here: their
#    own backends for this arch's accepted cells (the engines' GPU backend classes);
# 4. the bandwidth benchmark (benchmarks/kernel.py) and the libraries benchmark.
# Each step has its own time limit and its log under OUT_DIR; a step that fails or
# times out is recorded and the next one still runs. Exit status: 0 when every step
# that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-reports/gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
arch=$("$PY" -c 'import torch; p=torch.cuda.get_device_capability(); print(f"sm{p[0]}{p[1]}")' 2>/dev/null) || {
  echo "gpu.sh: no CUDA GPU visible to $PY; nothing to do" | tee "$OUT/summary.txt"; exit 0; }
jobs=$(( $(nproc) < 8 ? $(nproc) : 8 ))
status=0
summary="$OUT/summary.txt"
{ echo "host arch $arch, $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)";
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$summary"

step() {  # step NAME SECONDS COMMAND...
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  local what="rc $rc"; [[ $rc == 124 || $rc == 137 ]] && what="TIMED OUT after ${limit}s"
  echo "$name: $what in $((SECONDS - t0))s" | tee -a "$summary"
  [[ $rc == 0 ]] || status=1
}

step kernel-tests 150 "$PY" -m pytest -p no:cacheprovider -q -x tests/kernels -n "$jobs" -m "not gpu_emulation"
step emulation-agreement 120 "$PY" -m pytest -p no:cacheprovider -q -rs tests/kernels/emulated -m gpu_emulation
step reference-matrix 120 "$PY" -m pytest -p no:cacheprovider -q --mla-matrix=matrix/reference.toml \
  --mla-arch="$arch" -n "$jobs" --mla-report-dir="$OUT" --mla-report-name="{matrix}-$arch"
for engine in sglang vllm; do
  if "$PY" -c "import $engine" > /dev/null 2>&1; then
    step "$engine-matrix" 120 "$PY" -m pytest -p no:cacheprovider -q -c tools/engine-pytest.ini --rootdir . \
      --mla-matrix="matrix/$engine.toml" --mla-arch="$arch" -n "$jobs" --mla-report-dir="$OUT" \
      --mla-report-name="{engine}-{version}-$arch"
  else
    echo "$engine-matrix: skipped ($engine does not import here)" | tee -a "$summary"
  fi
done
step kernel-bench 90 "$PY" benchmarks/kernel.py
step library-bench 40 "$PY" benchmarks/libraries.py --quick
cat "$summary"
exit $status
