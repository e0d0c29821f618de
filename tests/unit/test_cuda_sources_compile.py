"""The CUDA C of the BatchNorm GPU kernels compiles with NVRTC, every instantiation, without a GPU.

NVRTC compiles on any machine; it is found where pip installs it (`pip install nvidia-cuda-nvrtc-cu12
nvidia-cuda-runtime-cu12`, the runtime wheel for cuda_fp16.h), and the test is skipped where it is not
(CI has no CUDA). A developer without a GPU catches a template or syntax error here before a GPU run.
"""
import ctypes
import glob
import os
import sys

import pytest

from dmath.gpu import launcher
from dmath.ops.nn import norm_cuda


def _find(pattern):
    for root in sys.path:
        hits = sorted(glob.glob(os.path.join(root or ".", "nvidia", *pattern)))
        if hits:
            return hits[0]
    return None


def _nvrtc():
    lib, include = _find(("cuda_nvrtc", "lib", "libnvrtc.so.*")), _find(("cuda_runtime", "include"))
    if lib is None or include is None:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12)")
    return ctypes.CDLL(lib), include


def _compile(source, names, arch="compute_90"):
    lib, include = _nvrtc()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"dmath.cu", 0, None, None) == 0
    for name in names:
        assert lib.nvrtcAddNameExpression(prog, name.encode()) == 0
    opts = [b"-std=c++14", b"-I" + include.encode(), b"--gpu-architecture=" + arch.encode()]
    result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lowered = []
    for name in names:
        out = ctypes.c_char_p()
        lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out))
        lowered.append(out.value)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return result, log.value.decode(errors="replace"), lowered


def test_batchnorm_kernels_compile():
    names = norm_cuda._names()
    # dtypes x vector widths x (3 sums, normalize with and without relu and a residual, dx without a mask
    # or masked by y, with and without dR; a sums and a dx recomputing the mask per gamma dtype)
    # + 2 finalizes per dtype set
    per_width = sum(11 + 2 * len(gammas) for gammas in norm_cuda._MASK_GAMMA.values())
    assert len(names) == 2 * per_width + 2 * len(norm_cuda._FINAL)
    result, log, lowered = _compile(launcher.PREAMBLE + norm_cuda.SOURCE, names)
    assert result == 0, log
    assert all(lowered), "every instantiation was compiled"


def test_elementwise_kernels_compile_in_both_loops():
    """Every function with a CUDA expression, as the one-launch scalar loop (one module per operand
    types) and as the 16-byte vector loop, for each dtype and with a scalar operand."""
    from dmath.ops.elementwise import FUNCTIONS
    from dmath.ops import elementwise_cuda as ew
    for dtype in ("float16", "float32", "float64"):
        for arity in (1, 2, 3, 4):
            full = ((dtype, "full"),) * arity
            text, names = ew.module_source(full, dtype)
            result, log, lowered = _compile(launcher.PREAMBLE + text, names)
            assert result == 0 and all(lowered), log
            for operands in [full] + ([((dtype, "full"), None)] if arity == 2 else []):
                fns = [fn for fn, f in FUNCTIONS.items() if f.cuda is not None and len(f.params) == arity]
                text = "".join(ew.vector_source(fn, operands, dtype) if k == 0 else
                               ew.vector_source(fn, operands, dtype).replace(ew._HELPERS, "")
                               for k, fn in enumerate(fns))
                result, log, lowered = _compile(launcher.PREAMBLE + text, [f"dm_ewisev_{fn}" for fn in fns])
                assert result == 0 and all(lowered), log


def test_table_kernels_compile():
    """The kernels over a table of arrays (dmath.nn's many-parameter updates, the all-finite test and
    dmath.astype_many):
    every instantiation, with the DmTable argument."""
    from dmath.ops import cast
    from dmath.ops.nn import update
    for source, names in ((update._MANY_SOURCE, update._MANY_NAMES), (update._FINITE_SOURCE, update._FINITE_INSTANCES),
                          (cast._SOURCE, cast._NAMES)):
        assert launcher.TABLE_STRUCT in source
        result, log, lowered = _compile(launcher.PREAMBLE + source, names)
        assert result == 0, log
        assert all(lowered), "every instantiation was compiled"


def test_pooling_kernels_compile():
    """The pooling kernels (dmath.ops.nn.pool): forward and backward, NCHW/NHWC and the channels-last
    vector kernels, every instantiation; compiled to machine code (sm_90), so that the inline PTX of
    the float16 pair comparisons is assembled too."""
    from dmath.ops.nn import pool
    result, log, lowered = _compile(launcher.PREAMBLE + pool._CUDA_SOURCE, pool._INSTANCES, arch="sm_90")
    assert result == 0, log
    assert "warning" not in log, log
    assert all(lowered), "every instantiation was compiled"
