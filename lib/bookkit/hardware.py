"""Published figures of an NVIDIA H100 GPU, typed once for every page.

Chapter 8's core page (the roofline) and its kernels page (the cost of the
exponential) use the same figures; they import them from here and glue them,
so the two pages cannot quote different numbers. Nothing here is measured:
these are the vendor's and the FlashAttention-3 paper's published figures.

Sources
-------
- NVIDIA, *H100 Tensor Core GPU Datasheet*, the H100 SXM column
  (https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet,
  the book's ``nvidia2023h100``): GPU memory bandwidth 3.35 TB/s (HBM3);
  FP32 67 teraFLOPS; BF16 Tensor Core 1,979 teraFLOPS, a figure the datasheet
  marks "with sparsity". Dense matrix products run at half of it, 989
  teraFLOPS, the figure the FlashAttention-3 paper uses.
- Shah et al., *FlashAttention-3* (2024), Section 3 (the book's
  ``shah2024flashattention3``): "the H100 SXM5 GPU has 989 TFLOPS of FP16
  matmul but only 3.9 TFLOPS of special functions", the units that compute
  the exponential.

The derived ratios are the roofline's ridge points (the machine balance,
FLOP per byte at which the bandwidth line meets a compute roof) and how much
faster the tensor cores are than the exponential units.
"""

from __future__ import annotations

__all__ = [
    "H100_HBM_TBPS",
    "H100_FP32_TFLOPS",
    "H100_BF16_DENSE_TFLOPS",
    "H100_BF16_SPARSE_TFLOPS",
    "H100_EXP_TFLOPS",
    "machine_balance",
    "H100_BALANCE_FP32",
    "H100_BALANCE_BF16",
    "H100_TENSOR_PER_EXP",
]

#: HBM3 bandwidth of the H100 SXM, in TB/s (datasheet).
H100_HBM_TBPS = 3.35
#: Float32 on the ordinary (CUDA) cores, in TFLOP/s (datasheet).
H100_FP32_TFLOPS = 67.0
#: Bfloat16 tensor cores with 2:4 structured sparsity, in TFLOP/s (datasheet).
H100_BF16_SPARSE_TFLOPS = 1979.0
#: Dense bfloat16 tensor-core matrix products, in TFLOP/s: half the sparse
#: figure, rounded as the FlashAttention-3 paper quotes it.
H100_BF16_DENSE_TFLOPS = 989.0
#: The special-function units that compute exp2, in TFLOP/s (FlashAttention-3).
H100_EXP_TFLOPS = 3.9


def machine_balance(tflops: float, bandwidth_tbps: float = H100_HBM_TBPS) -> float:
    """The roofline's ridge point: peak FLOP/s over bandwidth, in FLOP/byte.

    An operation whose arithmetic intensity is below it waits for memory.
    """
    return tflops / bandwidth_tbps


#: Ridge point for the float32 cores, in FLOP/byte (about 20).
H100_BALANCE_FP32 = machine_balance(H100_FP32_TFLOPS)
#: Ridge point for the dense bfloat16 tensor cores, in FLOP/byte (about 295).
H100_BALANCE_BF16 = machine_balance(H100_BF16_DENSE_TFLOPS)
#: How many times faster the tensor cores are than the exponential units.
H100_TENSOR_PER_EXP = H100_BF16_DENSE_TFLOPS / H100_EXP_TFLOPS
