#!/usr/bin/env bash
# Conformance: run matrix/sglang.toml and matrix/vllm.toml against the REAL engines'
# validation code, each in its own virtual environment, on a CPU-only machine.
#
#   tools/conformance.sh                        # create/reuse the default venvs, run their matrices
#   tools/conformance.sh --install-only         # only create/refresh the venvs
#   tools/conformance.sh --only sglang-0.5.22   # a default venv: sglang, sglang-0.5.22, vllm (repeatable)
#   tools/conformance.sh --engine sglang==0.5.21 [--engine vllm==0.33.0 ...] [--install-only]
#                                               # any release: builds .venv-NAME-VERSION, runs its matrix
#   make conformance ENGINES="sglang==0.5.21 vllm==0.33.0"    # the same, through make
#   tools/conformance.sh --no-strict-coverage   # list a registered MLA-capable backend the matrix lacks
#                                               # under "not covered" instead of failing the run
#
# Default venvs: .venv-sglang (sglang 0.5.23), .venv-sglang-0.5.22, .venv-vllm (vllm 0.34.0).
# --engine NAME==VERSION (NAME: sglang or vllm) builds .venv-NAME-VERSION instead of the defaults.
# Each venv holds CPU torch 2.13.0, the engine's pure-Python import-time dependencies (and those a
# release needs beyond them, e.g. xgrammar for sglang 0.5.20), the engine itself installed
# --no-deps (its pins want CUDA torch), and pytest-mla (-e, --no-deps) with pytest/packaging/
# tabulate. Transitive versions come from tools/locks/NAME-VERSION.txt (pip freeze of a venv that
# passed); a release without a lock file still builds, unpinned, with a warning. A stamp file
# records the pins; a venv whose stamp matches is reused as is, so a rerun only runs the matrices.
# Reports: reports/NAME-VERSION.{json,md,html} (e.g. reports/sglang-0.5.23.*), and after a green run
# with kernel checks NAME-VERSION.source, the hash of the source it ran (tools/ci_reports.py).
# Environment: MLA_CONFORMANCE_KERNEL=auto|off (default auto: run the engines' own kernels),
# MLA_CONFORMANCE_JOBS (pytest -n, default 2), MLA_REPORT_DIR (default reports),
# MLA_CONFORMANCE_VALIDATION_ONLY (reports, e.g. "sglang-0.5.22": those matrices run --mla-kernel=off),
# MLA_CONFORMANCE_QUICK (reports: those matrices run --mla-tier=quick: every cell validated, numeric
# checks on the covering sample; neither a quick nor a validation-only run writes NAME-VERSION.source),
# MLA_STRICT_COVERAGE (default 1: every engine is held to --mla-strict-coverage, a registered
# MLA-capable backend its matrix lacks fails the run; 0 or --no-strict-coverage: only listed; a comma
# list of engines, e.g. vllm: only those held to it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
REPORT_DIR="${MLA_REPORT_DIR:-reports}"
TRIES="${MLA_PIP_TRIES:-3}"

TORCH_PIN="torch==2.13.0"
TRITON_PIN="triton==3.9.0"
HARNESS_DEPS="pytest>=8.1 packaging>=23 tabulate>=0.9 pytest-xdist>=3.5"
JOBS="${MLA_CONFORMANCE_JOBS:-2}"  # pytest -n: cells (and their kernel checks) over this many workers
# auto: accepted cells run the engine's own kernels (its Triton backends under the interpreter
# here, every backend on a GPU); off: validation only.
KERNEL="${MLA_CONFORMANCE_KERNEL:-auto}"
VALIDATION_ONLY="${MLA_CONFORMANCE_VALIDATION_ONLY:-}"
QUICK="${MLA_CONFORMANCE_QUICK:-}"
# Import-time dependencies of the engines (shared/reference/*.md), pure Python or CPU wheels.
SGLANG_DEPS="numpy orjson psutil pybase64 requests packaging pillow fastapi msgspec pyzmq tqdm \
ipython aiohttp transformers dill sentencepiece loguru gguf openai partial_json_parser einops \
apache-tvm-ffi uvicorn pydantic"
SGLANG_NODEPS="compressed-tensors"
VLLM_DEPS="$SGLANG_DEPS cachetools cbor2 cloudpickle uvloop py-cpuinfo prometheus_client \
llguidance blake3 msgspec pyyaml regex tokenizers protobuf diskcache lark openai-harmony \
prometheus-fastapi-instrumentator watchfiles setproctitle"
VLLM_NODEPS="compressed-tensors xgrammar"

# Import-time dependencies particular releases need beyond their engine's list (installed --no-deps).
release_nodeps() {
  case "$1" in
    sglang==0.5.20) echo "xgrammar" ;;  # 0.5.20 imports xgrammar unguarded (constrained decoding)
    *) echo "" ;;
  esac
}

# name | engine pin | deps | no-deps extras | lock file (exact versions of everything else)
DEFAULT_VENVS=(
  ".venv-sglang|sglang==0.5.23|SGLANG_DEPS|SGLANG_NODEPS|tools/locks/sglang-0.5.23.txt"
  ".venv-sglang-0.5.22|sglang==0.5.22|SGLANG_DEPS|SGLANG_NODEPS|tools/locks/sglang-0.5.22.txt"
  ".venv-vllm|vllm==0.34.0|VLLM_DEPS|VLLM_NODEPS|tools/locks/vllm-0.34.0.txt"
)
STAMP_VERSION=2

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; }

install_only=0
strict=()
strict_engines="${MLA_STRICT_COVERAGE:-1}"
[[ "$strict_engines" == 1 ]] && strict=(--mla-strict-coverage)
only=()
engines=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --install-only) install_only=1 ;;
    --strict-coverage) strict=(--mla-strict-coverage) ;;
    --no-strict-coverage) strict=(); strict_engines=0 ;;
    --only) [[ $# -ge 2 ]] || { echo "conformance: --only needs a name" >&2; exit 2; }; only+=("$2"); shift ;;
    --engine) [[ $# -ge 2 ]] || { echo "conformance: --engine needs NAME==VERSION" >&2; exit 2; }
              engines+=("$2"); shift ;;
    --engine=*) engines+=("${1#--engine=}") ;;
    -h|--help) usage; exit 0 ;;
    *) echo "conformance: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

VENVS=()
if [[ ${#engines[@]} -gt 0 ]]; then
  if [[ ${#only[@]} -gt 0 ]]; then
    echo "conformance: --only selects default venvs; it cannot be combined with --engine" >&2; exit 2
  fi
  for spec in "${engines[@]}"; do
    if [[ ! "$spec" =~ ^(sglang|vllm)==([0-9][0-9A-Za-z.+!-]*)$ ]]; then
      echo "conformance: --engine $spec: expected NAME==VERSION with NAME sglang or vllm (e.g. sglang==0.5.21)" >&2
      exit 2
    fi
    name="${BASH_REMATCH[1]}" version="${BASH_REMATCH[2]}"
    deps="SGLANG_DEPS" nodeps="$SGLANG_NODEPS"
    [[ "$name" == vllm ]] && deps="VLLM_DEPS" nodeps="$VLLM_NODEPS"
    extra="$(release_nodeps "$spec")"
    var="NODEPS_${#VENVS[@]}"
    printf -v "$var" '%s' "$nodeps${extra:+ $extra}"
    VENVS+=(".venv-$name-$version|$spec|$deps|$var|tools/locks/$name-$version.txt")
  done
else
  VENVS=("${DEFAULT_VENVS[@]}")
  known=()
  for entry in "${VENVS[@]}"; do known+=("${entry%%|*}"); done
  known=("${known[@]#.venv-}")
  for o in "${only[@]}"; do  # a name that selects nothing would run nothing and exit 0
    if [[ ! " ${known[*]} " == *" $o "* ]]; then
      echo "conformance: --only $o: not a default venv (known: ${known[*]}; the report name vllm-0.34.0 is venv vllm)" >&2
      exit 2
    fi
  done
fi

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# pip with retries and backoff (transient network errors are common on first installs).
pip_retry() {
  local py="$1"; shift
  local try=1 wait=5
  until "$py" -m pip install --quiet --disable-pip-version-check "$@"; do
    if (( try >= TRIES )); then
      echo "conformance: pip install $* failed after $TRIES tries" >&2
      return 1
    fi
    echo "conformance: pip install failed (try $try/$TRIES), retrying in ${wait}s" >&2
    sleep "$wait"; try=$((try + 1)); wait=$((wait * 3))
  done
}

selected() {
  local dir="$1" name
  [[ ${#only[@]} -eq 0 ]] && return 0
  name="${dir#.venv-}"
  for o in "${only[@]}"; do [[ "$o" == "$name" ]] && return 0; done
  return 1
}

ensure_venv() {
  local dir="$1" engine="$2" deps="$3" nodeps="$4" lock="$5"
  local stamp="$dir/.mla-stamp"
  local want locksum="none"
  if [[ -f "$lock" ]]; then
    locksum="$(cksum < "$lock")"
  else
    echo "conformance: WARNING: no lock file $lock for $engine: transitive dependencies are not pinned" >&2
  fi
  want="v$STAMP_VERSION $engine $TORCH_PIN $TRITON_PIN | $deps | nodeps: $nodeps | $HARNESS_DEPS | lock $locksum"
  if [[ -x "$dir/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    # The editable install points at this checkout; refresh it cheaply if the tree moved.
    if ! "$dir/bin/python" -c 'import pytest_mla, sys; sys.exit(0 if pytest_mla.__file__.startswith(sys.argv[1]) else 1)' "$ROOT" 2>/dev/null; then
      pip_retry "$dir/bin/python" --no-deps -e "$ROOT"
    fi
    echo "conformance: $dir reused (pins match)"
    return 0
  fi
  local t0; t0="$(now)"
  echo "conformance: creating $dir ($engine)"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  local py="$dir/bin/python"
  local constraints="$dir/.mla-constraints.txt"
  # The lock (pip freeze of a venv that passed) keeps transitive versions from drifting.
  { printf '%s\n' "$TORCH_PIN" "$TRITON_PIN"; [[ -f "$lock" ]] && cat "$lock"; } > "$constraints"
  pip_retry "$py" "$TORCH_PIN" "$TRITON_PIN"
  # shellcheck disable=SC2086
  pip_retry "$py" -c "$constraints" $deps $HARNESS_DEPS
  # shellcheck disable=SC2086
  pip_retry "$py" --no-deps -c "$constraints" $nodeps
  pip_retry "$py" --no-deps "$engine"
  pip_retry "$py" --no-deps -e "$ROOT"
  echo "$want" > "$stamp"
  echo "conformance: $dir installed in $(elapsed "$t0")s"
}

run_matrix() {
  local dir="$1" matrix="$2" engine="$3" report="$4"
  local t0; t0="$(now)"
  local rc=0
  local strict_here=("${strict[@]}")
  [[ ",$strict_engines," == *",$engine,"* ]] && strict_here=(--mla-strict-coverage)
  local kernel="$KERNEL"
  [[ " ${VALIDATION_ONLY//,/ } " == *" $report "* ]] && kernel=off
  local tier=full
  [[ " ${QUICK//,/ } " == *" $report "* ]] && tier=quick
  # A report whose kernel column this run computed records the source it was computed from
  # (tools/ci_reports.py): CI may then trust that column while the source is unchanged.
  rm -f "$REPORT_DIR/$report.source"
  "$dir/bin/python" -m pytest -p no:cacheprovider -q --no-header -rN \
    --rootdir "$ROOT" -c "$ROOT/tools/engine-pytest.ini" \
    --mla-matrix="$matrix" --mla-kernel="$kernel" --mla-tier="$tier" -n "$JOBS" \
    --mla-report-dir="$REPORT_DIR" --mla-report-name='{engine}-{version}' "${strict_here[@]}" || rc=$?
  if (( rc == 0 )) && [[ "$kernel" == auto && "$tier" == full ]]; then
    "$dir/bin/python" "$ROOT/tools/ci_reports.py" source-hash > "$REPORT_DIR/$report.source"
  fi
  echo "conformance: $matrix with $dir (kernels: $kernel, tier: $tier): exit $rc in $(elapsed "$t0")s"
  return $rc
}

total0="$(now)"
status=0
chosen=()
for spec in "${VENVS[@]}"; do
  IFS='|' read -r dir _ _ _ _ <<<"$spec"
  selected "$dir" && chosen+=("$spec")
done
ensure_spec() {
  local dir engine depsvar nodepsvar lock
  IFS='|' read -r dir engine depsvar nodepsvar lock <<<"$1"
  ensure_venv "$dir" "$engine" "${!depsvar}" "${!nodepsvar}" "$lock"
}
if (( install_only )); then
  for spec in "${chosen[@]}"; do ensure_spec "$spec"; done
  echo "conformance: venvs ready in $(elapsed "$total0")s"
  exit 0
fi
# The first venv is made now; the others in the background while its matrix runs (pip waits on the
# network and the disk more than on the CPU), their log printed once they are needed.
builder="" builder_log=""
(( ${#chosen[@]} )) && ensure_spec "${chosen[0]}"
if (( ${#chosen[@]} > 1 )); then
  builder_log="$(mktemp)"
  # (no `|| exit` here: errexit stops the subshell at a failing pip, as it would the script)
  ( for spec in "${chosen[@]:1}"; do ensure_spec "$spec"; done ) > "$builder_log" 2>&1 &
  builder=$!
fi
first=1
for spec in "${chosen[@]}"; do
  IFS='|' read -r dir engine _ _ _ <<<"$spec"
  if (( ! first )) && [[ -n "$builder" ]]; then
    build_rc=0
    wait "$builder" || build_rc=$?
    cat "$builder_log"; rm -f "$builder_log"; builder=""
    if (( build_rc )); then
      echo "conformance: creating the venvs after ${chosen[0]%%|*} failed (exit $build_rc)" >&2
      exit 1
    fi
  fi
  first=0
  case "$engine" in
    sglang*) matrix=matrix/sglang.toml; name=sglang ;;
    vllm*) matrix=matrix/vllm.toml; name=vllm ;;
  esac
  run_matrix "$dir" "$matrix" "$name" "${engine/==/-}" || status=1
done
echo "conformance: total $(elapsed "$total0")s"
exit $status
