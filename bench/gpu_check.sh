#!/usr/bin/env bash
# One-GPU readiness check (bench/gpu_check.py): <= 8 minutes on a machine with one CUDA GPU.
#
#   TORCH_CUDA_INDEX=<PyTorch's CUDA wheel index URL, e.g. its cu128 index> bench/gpu_check.sh
#   bench/gpu_check.sh --smoke          # tiny sizes on CPU: no install, the same code path
#
# Installs the CUDA build of torch (by package name, from the wheel index in TORCH_CUDA_INDEX, at the version
# in TORCH_VERSION, default the one installed) unless torch already sees a CUDA device, then raybench itself,
# then runs bench/gpu_check.py with the remaining arguments. Time limits: install INSTALL_LIMIT_S (140),
# the check CHECK_LIMIT_S (340, smoke 1800; each part has its own limit too). Exit status: 0 all parts passed,
# 1 a part failed, 2 the install failed or TORCH_CUDA_INDEX is missing, 3 or 124 a time limit was hit.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
say() { echo "[gpu_check.sh] $*"; }

if [[ " $* " != *" --smoke "* ]]; then
  if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    say "torch already sees a CUDA device: no install"
  else
    if [[ -z "${TORCH_CUDA_INDEX:-}" ]]; then
      say "FAIL: torch does not see a CUDA device; set TORCH_CUDA_INDEX to PyTorch's CUDA wheel index URL"
      exit 2
    fi
    version="${TORCH_VERSION:-$("$PY" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null)}"
    spec="torch${version:+==$version}"
    say "installing $spec from \$TORCH_CUDA_INDEX (limit ${INSTALL_LIMIT_S:-140} s)"
    t0=$SECONDS
    if ! timeout "${INSTALL_LIMIT_S:-140}" "$PY" -m pip install --quiet --force-reinstall "$spec" \
        --index-url "$TORCH_CUDA_INDEX"; then
      say "FAIL: installing $spec from \$TORCH_CUDA_INDEX failed or ran past its limit"
      exit 2
    fi
    "$PY" -m pip install --quiet --no-deps -e . || { say "FAIL: pip install -e . failed"; exit 2; }
    say "installed in $((SECONDS - t0)) s: $("$PY" -c "import torch; print(torch.__version__, torch.cuda.is_available())")"
  fi
fi
limit="${CHECK_LIMIT_S:-340}"
[[ " $* " == *" --smoke "* ]] && limit="${CHECK_LIMIT_S:-1800}"  # a busy CPU machine: correctness, not speed
timeout --kill-after=30 "$limit" "$PY" bench/gpu_check.py "$@"
rc=$?
[[ $rc -eq 124 ]] && say "FAIL: the check ran past $limit s"
exit $rc
