"""Builds the Cython hot paths: every av_infer/_cy/NAME.pyx becomes av_infer._cy.NAME (the
sources live beside the package they build; .pxd files there declare the cdef APIs other
modules cimport as ``av_infer._cy.NAME``), and the Python modules listed in
av_infer/_cy/compiled.py are compiled with the .pxd beside them (pure-Python mode)."""

import os
import runpy
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

ROOT = Path(__file__).parent
# -O3 as before; -g0: no debug information (Python's own flags ask for -g, which costs a
# quarter of the compile time of these large generated files and nothing at run time;
# AV_INFER_CFLAGS replaces both, e.g. "-O3 -g" for a line-level profile)
CFLAGS = os.environ.get("AV_INFER_CFLAGS", "-O3 -g0").split()
extensions = [
    Extension(
        f"av_infer._cy.{pyx.stem}",
        [str(pyx.relative_to(ROOT))],
        include_dirs=[np.get_include()],
        extra_compile_args=CFLAGS,
    )
    for pyx in sorted((ROOT / "av_infer" / "_cy").glob("*.pyx"))
]
# Python modules compiled with the C types of the .pxd beside them (Cython's pure-Python
# mode; the list and the staleness check: av_infer/_cy/compiled.py).
PURE_MODULES = runpy.run_path(str(ROOT / "av_infer" / "_cy" / "compiled.py"))["PURE_MODULES"]
extensions += [
    Extension(f"av_infer.{mod}", [f"av_infer/{mod.replace('.', '/')}.py"],
              include_dirs=[np.get_include()],  # for those that cimport _cy.ndcheck
              extra_compile_args=CFLAGS)
    for mod in PURE_MODULES
]

setup(
    package_data={"av_infer.kernels.cuda": ["*.cu", "*.cuh"],
                  "av_infer.devices.cuda_emu": ["*.c", "*.h"],
                  "av_infer.qos": ["data/*.json"],
                  "av_infer.bench": ["workloads/*.json"]},
    # av_infer/ and its subpackages, plus nodes/ installed as `av_infer_nodes`.
    packages=find_packages(include=["av_infer", "av_infer.*"]) + ["av_infer_nodes"],
    package_dir={"av_infer_nodes": "nodes"},
    # AV_INFER_NO_EXT=1 (the Makefile's editable install, after its in-place build): no
    # extensions, so `pip install -e .` does not compile every module again, one at a time
    # in a temporary folder (5 of `make test`'s 15 minutes on a fresh 2-core clone); the
    # in-place build's .so files beside the sources are what the editable install imports
    ext_modules=[] if os.environ.get("AV_INFER_NO_EXT") == "1" else cythonize(
        extensions,
        language_level=3,
        # C generation of the modules in parallel (the build's longest serial part)
        nthreads=os.cpu_count() or 1,
        include_path=[str(ROOT)],
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True},
    ),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/av_infer"]),
        ("share/av_infer", ["package.xml"]),
        ("share/av_infer/launch", [str(p) for p in sorted(Path("launch").glob("*.py"))]),
        ("share/av_infer/param", [str(p) for p in sorted(Path("param").glob("*.yaml"))]),
    ],
)
