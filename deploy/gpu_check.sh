#!/usr/bin/env bash
# GPU acceptance checks for a Tessera worker node, in one call and under 10 minutes: the service
# end to end on the GPU, NCCL DDP and FSDP2 over every GPU, bf16 and fp16+GradScaler, CUDA OOM -> microbatch halving, DCP
# save/resume, deterministic pooling, a speedup recipe, and ResNet-50 bf16-vs-fp32 throughput
# (deploy/gpu_check.py).
#
#   deploy/gpu_check.sh                 # all checks
#   deploy/gpu_check.sh bf16 dcp_resume # some of them
#
# Prints a PASS/FAIL table and exits 1 if any check failed; on a machine without CUDA it
# prints "skipped: no GPU" and exits 0. PYTHON picks the interpreter (default: the repo's
# .venv if there is one, else python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"  # the checks' own local Ray
cd "$(mktemp -d)"   # local runs write .tessera/ under the working directory
exec timeout --signal=INT --kill-after=30 "${GPU_CHECK_TIMEOUT_S:-570}" "$PYTHON" "$ROOT/deploy/gpu_check.py" "$@"
