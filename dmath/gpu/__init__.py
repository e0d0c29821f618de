"""GPU library wrappers, called by the kernels under dmath/ops: cuBLAS (blas.py), cuBLASLt
(cublaslt.py), cuDNN (cudnn.py) and the CUDA C compiler and launcher of the GPU-only kernels
(launcher.py). On the CPU backend blas.py falls back to NumPy; the others are used only on a GPU."""
