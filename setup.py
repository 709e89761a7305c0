"""Build mla_ext: one CUDA extension library on the LibTorch stable ABI.

    pip install --no-build-isolation .          # users
    pip install --no-build-isolation -e .       # development (rebuild with the same command)

Environment:
    CUDA_HOME              CUDA toolkit root (default: found from nvcc, else /usr/local/cuda)
    MLA_EXT_CUDA_ARCHS     ';'-separated targets, default "90a;100a" (e.g. "90a" for a faster
                           build that runs only on Hopper). PTX of the newest target is embedded
                           for forward compatibility.
    MAX_JOBS               parallel compile jobs (default: number of CPUs)
"""

import glob
import importlib.util
import os
import shutil

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
# torch 2.11, the oldest torch the built library must load into.
TORCH_TARGET_VERSION = "0x020b000000000000"


def _find_cuda_home() -> str:
    """torch guesses CUDA_HOME from `which nvcc`; a wrapper script in /usr/local/bin makes that
    guess /usr/local. Resolve the real toolkit before torch.utils.cpp_extension is imported."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for home in candidates:
        if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")) and os.path.exists(
            os.path.join(home, "bin", "nvcc")
        ):
            return home
    raise RuntimeError(
        "mla_ext: no CUDA toolkit found. Set CUDA_HOME to the toolkit root (the folder with "
        "bin/nvcc and include/cuda_runtime.h)."
    )


os.environ["CUDA_HOME"] = _find_cuda_home()
os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))

from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402


def _cutlass_include() -> str:
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "mla_ext: the CUTLASS headers come from the nvidia-cutlass package; install it with "
            "`pip install --no-deps nvidia-cutlass==4.2.0.0` (the headers need nothing else)."
        )
    include = os.path.join(list(spec.submodule_search_locations)[0], "source", "include")
    if not os.path.exists(os.path.join(include, "cute", "tensor.hpp")):
        raise RuntimeError(f"mla_ext: nvidia-cutlass is installed but {include} has no CuTe headers")
    return include


def _gencode_flags() -> list[str]:
    archs = [a.strip() for a in os.environ.get("MLA_EXT_CUDA_ARCHS", "90a;100a").split(";") if a.strip()]
    if not archs:
        raise RuntimeError("mla_ext: MLA_EXT_CUDA_ARCHS is empty; give e.g. '90a;100a'")
    flags = []
    for arch in archs:
        if not arch[:2].isdigit():
            raise RuntimeError(f"mla_ext: MLA_EXT_CUDA_ARCHS entry {arch!r} is not like '90a'")
        if int("".join(c for c in arch if c.isdigit())) < 90:
            raise RuntimeError(f"mla_ext: MLA_EXT_CUDA_ARCHS entry {arch!r}: the kernels need sm90 or newer "
                               "(mbarrier transaction counts, bulk copies, 227 KB of shared memory)")
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    # Portable PTX of the newest target (without the arch-specific 'a' features, which do not
    # carry forward), so a future GPU can JIT it.
    newest = archs[-1].rstrip("af")
    flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return flags


def _sources() -> list[str]:
    files = glob.glob("csrc/**/*.cu", recursive=True) + glob.glob("csrc/**/*.cpp", recursive=True)
    return sorted(os.path.relpath(f, ROOT) if os.path.isabs(f) else f for f in files)


cuda_home = os.environ["CUDA_HOME"]
include_dirs = [
    os.path.join(ROOT, "csrc"),
    _cutlass_include(),
    # CUDA 13 keeps the CCCL headers (cub, thrust, cuda/std) here; host-compiled files that
    # include CUTLASS need it.
    os.path.join(cuda_home, "include", "cccl"),
]
common_defines = [
    f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}",
    # declares the CUDA parts of the stable C shim (current stream)
    "-DUSE_CUDA",
]
extra_compile_args = {
    "cxx": ["-O3", "-std=c++20", *common_defines],
    "nvcc": [
        "-O3",
        "-std=c++20",
        *common_defines,
        *_gencode_flags(),
        "--expt-relaxed-constexpr",
        "-lineinfo",  # source lines in Nsight Compute and compute-sanitizer reports
        "-Xptxas=-warn-spills",
        "--threads=2",
    ],
}

setup(
    ext_modules=[
        CUDAExtension(
            name="mla_ext._C",
            sources=_sources(),
            include_dirs=include_dirs,
            extra_compile_args=extra_compile_args,
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
