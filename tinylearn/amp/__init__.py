"""tl.amp — mixed precision: autocast, loss scaling, bfloat16 rounding, low-bit formats, bit allocation.

    with tl.autocast(dtype="bfloat16"):            # matmul/linear/conv2d in bf16, softmax/norms/losses in fp32
        loss = F.cross_entropy(model(x), y)
    scaler = tl.amp.GradScaler()                    # dynamic loss scaling for fp16
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()

Pieces: dtypes (bfloat16 via ml_dtypes, float16), bf16 (round-to-nearest-even by bit manipulation), autocast_mode
(op lists + the Function.apply hook), grad_scaler, lowbit (FP4 E2M1, INT2, STE fake-quant), mx (OCP MX block
scaling), sensitivity (Hutchinson Hessian trace, bit allocation), bench (``tinylearn bench amp``).
"""

from .autocast_mode import (
    FP32_OPS,
    LOWER_PRECISION_OPS,
    TINYLEARN_FP32_OPS,
    autocast,
    get_autocast_dtype,
    is_autocast_enabled,
    op_category,
)
from .bf16 import bf16_bits, bf16_bits_to_float32, round_to_bf16, to_bfloat16
from .dtypes import bfloat16, finfo, float16, is_floating, low_dtype
from .grad_scaler import GradScaler, update_scale
from .lowbit import (
    FP4_VALUES,
    absmax_scale,
    fake_quant_fp4,
    fake_quant_int2,
    fp4_decode,
    fp4_encode,
    fp4_round,
    int2_quantize,
)
from .mx import MX_FORMATS, mx_bits_per_element, mx_dequantize, mx_quantize, mx_round
from .planner import allowed_formats, layer_stats, plan_precision
from .sensitivity import (
    activation_traces,
    allocate_bits,
    forward_quantized_activations,
    hutchinson_trace,
    quantize_symmetric,
)

__all__ = [
    "FP32_OPS",
    "FP4_VALUES",
    "LOWER_PRECISION_OPS",
    "MX_FORMATS",
    "TINYLEARN_FP32_OPS",
    "GradScaler",
    "absmax_scale",
    "allowed_formats",
    "activation_traces",
    "allocate_bits",
    "autocast",
    "bf16_bits",
    "bf16_bits_to_float32",
    "bfloat16",
    "fake_quant_fp4",
    "fake_quant_int2",
    "forward_quantized_activations",
    "finfo",
    "float16",
    "fp4_decode",
    "fp4_encode",
    "fp4_round",
    "get_autocast_dtype",
    "hutchinson_trace",
    "int2_quantize",
    "is_autocast_enabled",
    "is_floating",
    "layer_stats",
    "low_dtype",
    "mx_bits_per_element",
    "mx_dequantize",
    "mx_quantize",
    "mx_round",
    "op_category",
    "plan_precision",
    "quantize_symmetric",
    "round_to_bf16",
    "to_bfloat16",
    "update_scale",
]

# issue 36 Part C: per-group loss scales (Q253), low-precision sharded Adam state with error feedback (Q219),
# low-rank saved activations (Q102b)
from .layer_scaler import PerGroupScaler, fp16_grad_roundtrip  # noqa: E402
from .lowprec_state import STATE_FORMATS, ShardedLowPrecisionAdam, quantize_state  # noqa: E402
from .lowrank_act import LowRankLinear, lowrank_factors, lowrank_linear  # noqa: E402

__all__ += [
    "STATE_FORMATS",
    "LowRankLinear",
    "PerGroupScaler",
    "ShardedLowPrecisionAdam",
    "fp16_grad_roundtrip",
    "lowrank_factors",
    "lowrank_linear",
    "quantize_state",
]
from .recompute_priority import recompute_priority, select_by_priority  # noqa: E402

__all__ += ["recompute_priority", "select_by_priority"]
from .saved_precision import (  # noqa: E402
    FORMAT_BYTES,
    QuantSavedLinear,
    plan_saved_precision,
    quant_saved_linear,
    quantize_saved,
)

__all__ += ["FORMAT_BYTES", "QuantSavedLinear", "plan_saved_precision", "quant_saved_linear", "quantize_saved"]
