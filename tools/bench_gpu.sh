#!/usr/bin/env bash
# The GPU record for docs/benchmarks.md: `upzoo bench blocks` and `upzoo bench model` on CUDA.
# Run on a machine with a CUDA device after the README's install command:
#   bash tools/bench_gpu.sh > gpu-bench.md
set -euo pipefail
export NO_ALBUMENTATIONS_UPDATE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo
echo "## upzoo bench blocks --device cuda --shape 16x64x128x128"
upzoo bench blocks --device cuda --shape 16x64x128x128 --runs 20
echo
echo "## upzoo bench blocks --device cuda --shape 2x32x32x96x96 --scale 1,2,2"
upzoo bench blocks --device cuda --shape 2x32x32x96x96 --scale 1,2,2 --runs 20
for recipe in recipes/cityscapes_unet_transposed.yaml recipes/cityscapes_unet_dysample.yaml recipes/volume_unet3d_aniso.yaml; do
  for amp in none bf16; do
    echo
    echo "## upzoo bench model $recipe --device cuda --amp $amp"
    upzoo bench model "$recipe" --device cuda --amp "$amp" --runs 50
  done
done
