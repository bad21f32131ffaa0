"""The fixed public API of DESIGN.md exists with the documented parameter names and defaults.

This guards the contract only (names, parameters, defaults); behaviour is tested per topic against torch.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import tinylearn as tl

# "module.attr": {param: default or inspect._empty}
SIGNATURES: dict[str, dict[str, object]] = {
    "autograd.gradcheck": {"fn": inspect._empty, "inputs": inspect._empty, "eps": 1e-6, "atol": 1e-5, "rtol": 1e-3},
    "nn.functional.conv2d": {"stride": 1, "padding": 0, "dilation": 1, "groups": 1},
    "nn.functional.max_pool2d": {"kernel_size": inspect._empty, "stride": None, "padding": 0},
    "optim.SGD": {"lr": inspect._empty, "momentum": 0.0, "weight_decay": 0.0},
    "optim.Adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    "conv.im2col": {"kernel_size": inspect._empty, "stride": 1, "padding": 0, "dilation": 1, "backend": "numpy"},
    "conv.col2im": {
        "output_size": inspect._empty,
        "kernel_size": inspect._empty,
        "stride": 1,
        "padding": 0,
        "dilation": 1,
    },
    "conv.conv2d": {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1},
    "conv.winograd_conv2d": {"bias": None, "padding": 0},
    "conv.fold_batchnorm": {
        "conv_w": inspect._empty,
        "conv_b": inspect._empty,
        "bn_mean": inspect._empty,
        "bn_var": inspect._empty,
        "bn_gamma": inspect._empty,
        "bn_beta": inspect._empty,
        "eps": inspect._empty,
    },
    "quant.calculate_qparams": {
        "min_val": inspect._empty,
        "max_val": inspect._empty,
        "dtype": "int8",
        "symmetric": False,
    },
    "quant.quantize": {"scale": inspect._empty, "zero_point": inspect._empty, "dtype": "int8", "axis": None},
    "quant.dequantize": {"scale": inspect._empty, "zero_point": inspect._empty, "axis": None},
    "quant.fake_quantize": {
        "scale": inspect._empty,
        "zero_point": inspect._empty,
        "quant_min": inspect._empty,
        "quant_max": inspect._empty,
        "axis": None,
    },
    "quant.fp8_encode": {"fmt": "e4m3", "saturate": False},
    "quant.fp8_decode": {"codes": inspect._empty, "fmt": inspect._empty},
    "quant.pack_int4": {"q": inspect._empty},
    "quant.unpack_int4": {"packed": inspect._empty, "n": inspect._empty},
    "quant.quantize_groupwise": {"w": inspect._empty, "group_size": 128, "bits": 4, "symmetric": True},
    "quant.int8_gemm": {"a_int8": inspect._empty, "b_int8": inspect._empty},
    "prune.l1_unstructured": {"module": inspect._empty, "name": inspect._empty, "amount": inspect._empty},
    "prune.random_unstructured": {"module": inspect._empty, "name": inspect._empty, "amount": inspect._empty},
    "prune.ln_structured": {"amount": inspect._empty, "n": inspect._empty, "dim": inspect._empty},
    "prune.global_unstructured": {"parameters": inspect._empty},
    "prune.n_m_sparsity": {"module": inspect._empty, "name": inspect._empty, "n": 2, "m": 4},
    "prune.remove": {"module": inspect._empty, "name": inspect._empty},
    "prune.AGPSchedule": {
        "initial_sparsity": inspect._empty,
        "final_sparsity": inspect._empty,
        "start_step": inspect._empty,
        "end_step": inspect._empty,
        "frequency": inspect._empty,
    },
    "sparse.BSR.from_dense": {"block_size": inspect._empty},
    "kernels.softmax": {"dim": -1},
    "kernels.layer_norm": {"weight": inspect._empty, "bias": inspect._empty, "eps": 1e-5},
    "kernels.bias_gelu": {"bias": inspect._empty},
    "kernels.flash_attention": {
        "q": inspect._empty,
        "k": inspect._empty,
        "v": inspect._empty,
        "causal": False,
        "block_size": 64,
    },
    "dist.all_reduce": {"tensor": inspect._empty, "op": "sum", "algorithm": "ring", "group": None},
    "dist.launch": {"fn": inspect._empty, "world_size": inspect._empty, "backend": "gloo", "timeout_s": 60},
    "dist.cost_model.predict": {
        "algorithm": inspect._empty,
        "nbytes": inspect._empty,
        "world_size": inspect._empty,
        "alpha_s": inspect._empty,
        "beta_s_per_byte": inspect._empty,
    },
    "dist.simulate": {
        "algorithm": inspect._empty,
        "world_size": inspect._empty,
        "nbytes": inspect._empty,
        "alpha_s": 1e-5,
        "beta_s_per_byte": 1e-10,
        "topology": None,
    },
    "memory.BuddyAllocator": {"capacity": inspect._empty, "min_block": 256},
    "memory.CachingAllocator": {"capacity": inspect._empty, "round_to": 512},
    "memory.plan": {"lifetimes": inspect._empty},
}

NAMES = [
    "Tensor",
    "cat",
    "stack",
    "where",
    "zeros",
    "ones",
    "randn",
    "rand",
    "arange",
    "manual_seed",
    "no_grad",
    "nn.Module",
    "nn.Parameter",
    "nn.Sequential",
    "nn.Linear",
    "nn.Conv2d",
    "nn.BatchNorm2d",
    "nn.LayerNorm",
    "nn.ReLU",
    "nn.GELU",
    "nn.Flatten",
    "nn.MaxPool2d",
    "nn.AvgPool2d",
    "nn.Dropout",
    "nn.Embedding",
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.sigmoid",
    "nn.functional.tanh",
    "nn.functional.softmax",
    "nn.functional.log_softmax",
    "nn.functional.cross_entropy",
    "nn.functional.mse_loss",
    "nn.functional.linear",
    "nn.functional.avg_pool2d",
    "nn.functional.batch_norm",
    "nn.functional.layer_norm",
    "nn.functional.dropout",
    "nn.functional.embedding",
    "data.load_digits",
    "data.DataLoader",
    "quant.MinMaxObserver",
    "quant.MovingAverageMinMaxObserver",
    "quant.PerChannelMinMaxObserver",
    "quant.PercentileObserver",
    "quant.MSEObserver",
    "quant.HistogramObserver",
    "quant.prepare",
    "quant.calibrate",
    "quant.convert",
    "quant.prepare_qat",
    "prune.is_pruned",
    "prune.sparsity",
    "prune.RigL",
    "conv.deform_conv2d",
    "memory.plan_window",
    "memory.apply_plan",
    "memory.CompactionPlan",
    "sparse.CSR",
    "sparse.ELL",
    "sparse.BSR",
    "kernels.available_backends",
    "dist.reduce_scatter",
    "dist.all_gather",
    "dist.broadcast",
    "memory.BumpAllocator",
    "memory.FirstFitAllocator",
    "memory.SlabAllocator",
    "memory.pooled",
    "testing.assert_close",
    "testing.cuda_available",
    "testing.nvcc_available",
    "testing.clang_available",
    "bench.measure",
    "bench.Comparison",
] + list(SIGNATURES)


def _resolve(path: str) -> object:
    obj: object = tl
    parts = path.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module("tinylearn." + ".".join(parts[: i + 1]))
    return obj


@pytest.mark.parametrize("name", NAMES)
def test_public_name_exists(name):
    assert _resolve(name) is not None


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature(name):
    params = inspect.signature(_resolve(name)).parameters
    for pname, default in SIGNATURES[name].items():
        assert pname in params, f"{name} lacks parameter {pname!r}; has {list(params)}"
        if default is not inspect._empty:
            assert params[pname].default == default, (
                f"{name}({pname}=...) default {params[pname].default!r} != {default!r}"
            )


def test_tensor_surface():
    t = tl.Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    assert t.dtype == "float32" or str(t.dtype) == "float32"
    for attr in (
        "shape",
        "dtype",
        "grad",
        "requires_grad",
        "numpy",
        "item",
        "detach",
        "backward",
        "reshape",
        "view",
        "transpose",
        "permute",
        "T",
        "flatten",
        "unsqueeze",
        "squeeze",
        "expand",
        "sum",
        "mean",
        "max",
        "min",
        "var",
        "exp",
        "log",
        "sqrt",
        "tanh",
        "sigmoid",
        "relu",
        "gelu",
        "abs",
        "clip",
        "maximum",
    ):
        assert hasattr(t, attr), attr
