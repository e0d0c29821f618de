"""CUDA C for the GPU-only kernels: the shared preamble, and modules compiled once per process.

The GPU variants of pooling, dropout and the image transform are CUDA C
compiled by NVRTC through CuPy's RawModule. They share the type helpers
below: values are read into float for half and float data (double for
double), as the NumPy kernels compute, and written back with one rounding.
"""
PREAMBLE = r"""
#include <cuda_fp16.h>
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
template <typename T> __device__ typename Acc<T>::type dm_val(T v) { return (typename Acc<T>::type)v; }
template <> __device__ float dm_val<half>(half v) { return __half2float(v); }
template <typename T> __device__ T dm_cast(double v) { return (T)v; }
template <> __device__ half dm_cast<half>(double v) { return __float2half((float)v); }
"""

#: numpy dtype name -> the C type of the kernels
C_TYPES = {"float16": "half", "float32": "float", "float64": "double"}

_modules = {}


def function(source, expression, expressions):
    """The compiled `expression` (e.g. 'dm_pool_fwd<float, float>') of `source` (PREAMBLE prepended).

    expressions: every instantiation the module provides (all of them are
    compiled together, once per process, at the first call).
    """
    module = _modules.get(source)
    if module is None:
        import cupy
        module = _modules[source] = cupy.RawModule(code=PREAMBLE + source, options=("-std=c++14",),
                                                   name_expressions=list(expressions))
    return module.get_function(expression)


def launch(fn, total, args, threads=256):
    """Run `fn` over `total` elements, one thread each, on the current stream (nothing for 0)."""
    if total:
        fn(((total + threads - 1) // threads,), (threads,), args)
