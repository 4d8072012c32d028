"""Build of the compiled analysis library (kernel and local search); everything else is in pyproject.toml.

ENKFLOW_MARCH selects the target CPU (default ``native``: the kernel is built
on the machine that runs it, as HPC codes are; set it to e.g. ``x86-64-v3``
for a portable build, or to an empty string for the compiler's default).
"""

import os

from setuptools import Extension, setup

march = os.environ.get("ENKFLOW_MARCH", "native")
# -fno-wrapv undoes the interpreter's -fwrapv, which blocks vectorization of the index arithmetic.
flags = ["-O3", "-std=c11", "-ffp-contract=fast", "-fopenmp-simd", "-fno-wrapv"]
if march:
    flags.append(f"-march={march}")

setup(
    ext_modules=[
        Extension(
            "enkflow.analysis._lanes",
            sources=["src/enkflow/analysis/_c/lanes.c", "src/enkflow/analysis/_c/search.c",
                     "src/enkflow/analysis/_c/serial.c"],
            extra_compile_args=flags,
            libraries=["m"],
        )
    ]
)
