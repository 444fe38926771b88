"""3D CARAFE, FADE and SAPA (issue: 3D reassembly): forward+backward time and peak memory of each
block at 2x16x16x32x32 -> scale (1, 2, 2) (guided blocks: a 16-channel guide at the output size).
Two formulations: upzoo's, the k³ neighbourhoods materialised (``Tensor.unfold``) then one einsum /
matmul; and the alternative that never holds them at once, a loop over the k³ offsets that adds
each shifted view of one padded copy times its kernel entry (written here, patched in). The memory
per voxel is compared with the same block in 2D at 2x16x32x32 -> x2. Timing is interleaved (each
round runs every variant once), median and IQR over the rounds; peak memory is the largest of three
passes (process RSS on the CPU).

    python tools/bench_reassembly_3d.py [--rounds 10] [--shape 2x16x16x32x32] [--k5]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

import upzoo.upsamplers.carafe as carafe_module
import upzoo.upsamplers.fade as fade_module
import upzoo.upsamplers.sapa as sapa_module
from upzoo import create_upsampler
from upzoo.bench.memory import peak_memory
from upzoo.bench.speed import compare_calls
from upzoo.upsamplers.pixel_shuffle import pixel_shuffle_nd


def shifted_views(x: torch.Tensor, k: int, axes: Sequence[int]) -> Iterator[torch.Tensor]:
    """The k^n neighbours of every point along ``axes``, one offset at a time (row-major, unfold's
    order): views of one zero-padded copy."""
    pad = [0] * (2 * x.dim())
    for axis in axes:
        pad[2 * (x.dim() - 1 - axis)] = pad[2 * (x.dim() - 1 - axis) + 1] = k // 2
    padded = F.pad(x, pad)
    for offset in itertools.product(range(k), repeat=len(axes)):
        index = [slice(None)] * x.dim()
        for axis, o in zip(axes, offset):
            index[axis] = slice(o, o + x.shape[axis])
        yield padded[tuple(index)]


def loop_reassemble(x, kernels, kernel_size, scale):
    b, c, *spatial = x.shape
    if len(spatial) == 2:
        return _original["reassemble"](x, kernels, kernel_size, scale)
    views = shifted_views(x, kernel_size, range(2, x.dim()))
    out = sum(v.unsqueeze(2) * w.unsqueeze(1) for v, w in zip(views, kernels.unbind(1)))  # unbind: one backward
    return pixel_shuffle_nd(out.reshape(b, c * kernels.shape[2], *spatial), scale)


def loop_similarity(self, queries, keys):
    if self.spatial_dims == 2:
        return _original["similarity"](self, queries, keys)
    views = shifted_views(keys, self.kernel_size, range(1, keys.dim() - 1))
    return torch.stack([torch.einsum("...rd,...d->...r", queries, view) for view in views], dim=-1)


_original = {"reassemble": carafe_module.reassemble, "similarity": sapa_module.SapaUpsampler._similarity}


@contextmanager
def formulation(name: str):
    """``loop`` patches the offset loop into the three blocks; anything else is upzoo's own."""
    modules = (carafe_module, fade_module, sapa_module)
    if name == "loop":
        for module in modules:
            module.reassemble = loop_reassemble
        sapa_module.SapaUpsampler._similarity = loop_similarity
    try:
        yield
    finally:
        for module in modules:
            module.reassemble = _original["reassemble"]
        sapa_module.SapaUpsampler._similarity = _original["similarity"]


def _step(name: str, shape: tuple[int, ...], scale: tuple[int, ...], way: str, **options):
    b, c, *spatial = shape
    guided = name != "carafe"
    extra = {"guide_channels": c} if guided else {}
    torch.manual_seed(0)
    block = create_upsampler(name, spatial_dims=len(spatial), in_channels=c, out_channels=c, scale=scale, **extra,
                             **options)  # fmt: skip
    x = torch.randn(*shape, requires_grad=True)
    guide = torch.randn(b, c, *(n * s for n, s in zip(spatial, scale)))

    def run() -> None:
        with formulation(way):
            y = block(x, guide) if guided else block(x)
            y.backward(torch.ones_like(y))
        block.zero_grad(set_to_none=True)
        x.grad = None

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shape", default="2x16x16x32x32")
    parser.add_argument("--k5", action="store_true", help="also the 3D blocks with the 2D kernel size, 5 (slow)")
    args = parser.parse_args()
    shape = tuple(int(v) for v in args.shape.split("x"))
    shape_2d = (shape[0], shape[1], *shape[3:])
    steps = {}
    for name in ("carafe", "fade", "sapa"):
        for k in (3, 5) if args.k5 else (3,):
            for way in ("loop", "materialised"):
                steps[f"{name} 3D k{k} {way}"] = _step(name, shape, (1, 2, 2), way, kernel_size=k)
        steps[f"{name} 2D"] = _step(name, shape_2d, (2, 2), "default")
    timings = compare_calls(steps, warmup=1, runs=args.rounds)  # interleaved: noise hits all alike
    memory = {k: max(peak_memory(run).mib for _ in range(3)) for k, run in steps.items()}
    voxels_3d, voxels_2d = shape[0] * shape[2] * shape[3] * shape[4], shape[0] * shape[3] * shape[4]
    shape_text = "x".join(map(str, shape_2d))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; 3D {args.shape} -> (1, 2, 2), "
        f"2D {shape_text} -> x2; forward+backward, median (IQR) of {args.rounds} rounds\n"
    )
    print("| block | fwd+bwd ms | vs materialised | peak MiB | KiB per input voxel | vs 2D per voxel |")
    print("|---|---|---|---|---|---|")
    for key, t in timings.items():
        name = key.split()[0]
        q1, med, q3 = t.q1, t.median, t.q3
        same_k = key.rsplit(" ", 1)[0] + " materialised" if "3D" in key else key
        versus = med / timings[same_k].median
        per_voxel = memory[key] * 1024 / (voxels_2d if key.endswith("2D") else voxels_3d)
        per_voxel_2d = memory[f"{name} 2D"] * 1024 / voxels_2d
        print(f"| {key} | {med * 1e3:.0f} ({q1 * 1e3:.0f}-{q3 * 1e3:.0f}) | {versus:.2f}x | {memory[key]:.0f} | "
              f"{per_voxel:.2f} | {per_voxel / per_voxel_2d:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
