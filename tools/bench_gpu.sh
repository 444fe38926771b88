#!/usr/bin/env bash
# The GPU record for docs/benchmarks.md, at most 8 minutes: blocks at 1024x2048 under bf16, the
# quickstart's training throughput, torch.compile's speed-up, and a two-process DDP run when two GPUs
# are present (tools/bench_gpu.py says what each section measures). On a machine with a CUDA device,
# after the README's install command:
#   bash tools/bench_gpu.sh > gpu-bench.md
set -euo pipefail
export NO_ALBUMENTATIONS_UPDATE=1 HF_HUB_OFFLINE=1
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 480 python tools/bench_gpu.py --device cuda "$@"
