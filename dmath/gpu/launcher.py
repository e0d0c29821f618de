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


#: the most blocks a grid-stride kernel of `Launcher` starts (each thread loops over the rest)
MAX_BLOCKS = 1 << 16
#: 64-bit words of a by-value table argument (kind 't'): the device pointers and sizes of many arrays
#: handed to one launch (3,072 bytes; a kernel's arguments may take 4 KB), so that one kernel works on
#: a whole list of arrays (every parameter of a model) where a launch per array cost more than its work
TABLE_WORDS = 384
#: the C declaration of that argument's type, and the lookup of a block's array, for the kernels that take
#: one. `Launcher.table` appends to each entry its first block (the entries' blocks in order, gridDim.x in
#: all): a block finds its array by a binary search of those words (the same for all its threads) and
#: strides over that array with the array's blocks only, so that a large array gets blocks in proportion to
#: its size and a small one no idle blocks (a grid of (blocks, arrays) gave each array the largest one's
#: blocks, or, capped, left AlexNet's 38 M-element weight to 128 blocks: a step's optimizer at a fifth of
#: the memory bandwidth)
TABLE_STRUCT = "struct DmTable { unsigned long long w[%d]; };\n" % TABLE_WORDS + r"""
// the entry of this block in a table of `count` entries of `words` words, the last one the entry's first
// block; *lb: the block's index within its entry, *nb: the entry's blocks
__device__ __forceinline__ int dm_table_entry(const DmTable& tab, int count, int words, long long* lb,
                                              long long* nb) {
    const long long b = blockIdx.x;
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if ((long long)tab.w[words * mid + words - 1] <= b) lo = mid; else hi = mid - 1;
    }
    const long long first = (long long)tab.w[words * lo + words - 1];
    const long long next = lo + 1 < count ? (long long)tab.w[words * (lo + 1) + words - 1] : (long long)gridDim.x;
    *lb = b - first;
    *nb = next - first;
    return lo;
}
"""
#: about the elements a thread of a table kernel is given: an array of n elements gets
#: ceil(n / (threads * TABLE_PER_THREAD)) blocks (at least one)
TABLE_PER_THREAD = 8


def table_chunks(count, words_per_array):
    """[(lo, hi)]: `count` arrays split into runs whose table entries (words_per_array words each) fit one
    DmTable (a pure rule)."""
    per = TABLE_WORDS // words_per_array
    return [(lo, min(lo + per, count)) for lo in range(0, count, per)]


def table_blocks(sizes, threads, per_thread=TABLE_PER_THREAD, limit=None):
    """(first block of each array, blocks in all) of one table launch over arrays of `sizes` elements (a
    pure rule): an array gets ceil(n / (threads * per_thread)) blocks, at least one; where the sum passes
    `limit` (MAX_BLOCKS), the largest arrays' shares are cut to the largest equal cap that fits (each
    block strides over its array, so any share covers it)."""
    limit = MAX_BLOCKS if limit is None else limit
    if len(sizes) > limit:
        raise ValueError(f"a table launch of {len(sizes)} arrays needs more than {limit} blocks")
    per = threads * per_thread
    want = [max(1, -(-int(n) // per)) for n in sizes]
    if sum(want) > limit:
        lo, hi = 1, max(want)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if sum(min(w, mid) for w in want) <= limit:
                lo = mid
            else:
                hi = mid - 1
        want = [min(w, lo) for w in want]
    firsts, at = [], 0
    for w in want:
        firsts.append(at)
        at += w
    return firsts, at


class Launcher:
    """A compiled kernel started through the driver with its argument block packed once.

    `kinds`: per kernel argument, 'p' (a device pointer), 'f' (float), 'd'
    (double), 'q' (int64), 'i' (int32) or 't' (a DmTable by value: up to
    TABLE_WORDS integers, given as a sequence; launch with `rows`). A call writes the values into the kept block and
    launches on the current stream, with less host time than a RawKernel
    call or a CuPy ufunc (they convert every argument on every call), which
    is most of an eager elementwise operation's cost on a GPU. The driver copies the block at the launch (and a CUDA-graph
    capture copies it into the graph), so the block is free to be rewritten
    by the next call. One thread per worker process calls it.
    """
    __slots__ = ("fn", "ptr", "slots", "argv_ptr", "argv", "threads", "_launch", "_stream")

    def __init__(self, fn, kinds, threads=256):
        import ctypes

        import cupy
        from cupy.cuda import driver
        c_types = {"p": ctypes.c_void_p, "f": ctypes.c_float, "d": ctypes.c_double, "q": ctypes.c_int64,
                   "i": ctypes.c_int32, "t": ctypes.c_uint64 * TABLE_WORDS}
        # (a RawKernel's compiled Function: its `ptr` is the CUfunction; it keeps its module loaded)
        self.fn, self.threads = getattr(fn, "kernel", fn), threads
        self.ptr = self.fn.ptr
        self.slots = [c_types[k]() for k in kinds]
        self.argv = (ctypes.c_void_p * len(kinds))(*[ctypes.addressof(s) for s in self.slots])
        self.argv_ptr = ctypes.addressof(self.argv)
        self._launch, self._stream = driver.launchKernel, cupy.cuda.get_current_stream

    def __call__(self, total, *values):
        """Run over `total` elements (a grid-stride kernel; nothing for 0) with arguments `values`."""
        if not total:
            return
        for slot, value in zip(self.slots, values):
            slot.value = value
        threads = self.threads
        blocks = min((total + threads - 1) // threads, MAX_BLOCKS)
        self._launch(self.ptr, blocks, 1, 1, threads, 1, 1, 0, self._stream().ptr, self.argv_ptr, 0)

    def rows(self, blocks, rows, *values):
        """Run a (blocks, rows) grid of `threads`-thread blocks with arguments `values` (a table
        argument takes a sequence of at most TABLE_WORDS integers; the rest of it keeps old words,
        which a kernel reads no further than its count). Nothing for no rows."""
        if not rows:
            return
        for slot, value in zip(self.slots, values):
            if hasattr(slot, "_length_"):
                if len(value) > TABLE_WORDS:
                    raise ValueError(f"a kernel table holds {TABLE_WORDS} words, got {len(value)}")
                slot[:len(value)] = value
            else:
                slot.value = value
        self._launch(self.ptr, max(1, min(blocks, MAX_BLOCKS)), rows, 1, self.threads, 1, 1, 0, self._stream().ptr,
                     self.argv_ptr, 0)

    def table(self, entries, *values):
        """Run a table kernel over the arrays of `entries` (each a list of words, its last the array's
        element count), one launch per DmTable of them: the kernel's arguments are the table (each entry's
        words and then its first block, `table_blocks`), the entries' count, then `values`. Nothing for
        no entries."""
        if not entries:
            return
        words = len(entries[0]) + 1
        for lo, hi in table_chunks(len(entries), words):
            part = entries[lo:hi]
            firsts, total = table_blocks([e[-1] for e in part], self.threads)
            self.rows(total, 1, [w for e, first in zip(part, firsts) for w in (*e, first)], len(part), *values)
