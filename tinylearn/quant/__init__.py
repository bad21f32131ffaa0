"""Quantization: affine int8/int4 maps, observers and calibration, FP8, int4 packing, fake-quant (STE, LSQ),
an exact int8 GEMM, quantized Linear/Conv2d, and the PTQ / QAT pipeline (prepare -> calibrate -> convert).

Shaped like torch.ao.quantization: Observer -> calculate_qparams -> FakeQuantize -> convert.
Kernel-selection helpers that no lesson calls through ``tl.quant`` (``maddubs_reference``, ``strassen_shape_error``,
``strassen_signs``, ...) live in ``tinylearn.quant.gemm``.
"""

from .affine import QRANGES, calculate_qparams, dequantize, qrange, quantize, quantize_dequantize
from .fp8 import FORMATS, DelayedScaling, fp8_decode, fp8_encode, fp8_matmul, fp8_quantize, fp8_table
from .gemm import (
    PackedInt8Weight,
    avx2_choice,
    cache_oblivious_matmul,
    int8_gemm,
    int8_gemm_paths,
    int8_gemm_versions,
    packed_versions,
    requantize,
    strassen_auto,
    strassen_reference,
    winograd_reference,
)
from .int4 import dequantize_groupwise, pack_int4, quantize_groupwise, unpack_int4
from .observers import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    MSEObserver,
    PercentileObserver,
    PerChannelMinMaxObserver,
    kl_threshold,
)

__all__ = [
    "QRANGES",
    "qrange",
    "calculate_qparams",
    "quantize",
    "dequantize",
    "quantize_dequantize",
    "FORMATS",
    "DelayedScaling",
    "fp8_encode",
    "fp8_decode",
    "fp8_matmul",
    "fp8_quantize",
    "fp8_table",
    "int8_gemm",
    "int8_gemm_paths",
    "int8_gemm_versions",
    "packed_versions",
    "winograd_reference",
    "strassen_reference",
    "cache_oblivious_matmul",
    "strassen_auto",
    "avx2_choice",
    "requantize",
    "PackedInt8Weight",
    "pack_int4",
    "unpack_int4",
    "quantize_groupwise",
    "dequantize_groupwise",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "PercentileObserver",
    "MSEObserver",
    "HistogramObserver",
    "kl_threshold",
]

from .equalize import bias_correction, cross_layer_equalize, equalize_scales
from .fake_quant import fake_quantize, fake_quantize_learnable
from .modules import (
    DynamicQuantizedLinear,
    FakeQuantize,
    FP8Linear,
    Int4WeightOnlyConv2d,
    Int4WeightOnlyLinear,
    LearnableFakeQuantize,
    QuantizedConv2d,
    QuantizedLinear,
    quantize_dynamic,
)
from .ptq import QConfig, calibrate, convert, default_qconfig, fuse_modules, model_size_bytes, prepare, prepare_qat

__all__ += [
    "fake_quantize",
    "fake_quantize_learnable",
    "FakeQuantize",
    "LearnableFakeQuantize",
    "QuantizedLinear",
    "QuantizedConv2d",
    "DynamicQuantizedLinear",
    "quantize_dynamic",
    "Int4WeightOnlyLinear",
    "Int4WeightOnlyConv2d",
    "FP8Linear",
    "QConfig",
    "default_qconfig",
    "fuse_modules",
    "prepare",
    "calibrate",
    "convert",
    "prepare_qat",
    "model_size_bytes",
    "cross_layer_equalize",
    "equalize_scales",
    "bias_correction",
]

from .autotune import KernelAutotuner, int8_gemm_autotuner  # noqa: E402
from .error_budget import allocate_bits, allocate_error_budget, choose_bits, measure_sensitivities  # noqa: E402
from .online_calib import OnlineRecalibrator, saturation_rate  # noqa: E402
from .shift_scale import LearnableShiftScale, fold_shift_scale, quantized_block  # noqa: E402

__all__ += [
    "OnlineRecalibrator",
    "saturation_rate",
    "allocate_error_budget",
    "allocate_bits",
    "choose_bits",
    "measure_sensitivities",
    "LearnableShiftScale",
    "fold_shift_scale",
    "quantized_block",
    "KernelAutotuner",
    "int8_gemm_autotuner",
]

from .pareto import BitCostModel, bit_width_search, dominates, enumerate_bit_configs, layer_profile, pareto_front  # noqa: E402

__all__ += ["pareto_front", "dominates", "enumerate_bit_configs", "BitCostModel", "layer_profile", "bit_width_search"]
