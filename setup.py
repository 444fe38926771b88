"""Build of the optional fused CPU kernel of the masked blur; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and the blur runs its PyTorch
formulation (``upzoo.filters.masked_blur.FUSED_CPU_KERNEL`` tells which one is in use).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "upzoo.filters._masked_blur_cpu",
            sources=["upzoo/filters/_masked_blur_cpu.c"],
            depends=["upzoo/filters/_masked_blur_cpu_impl.h"],
            extra_compile_args=["-O3", "-std=c11", "-fopenmp"],
            extra_link_args=["-fopenmp"],  # libgomp.so.1: resolves to the copy PyTorch loads
            optional=True,
        )
    ]
)
