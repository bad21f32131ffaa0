"""TinyGPT's decode fast path (inference/decode_fast.py): bitwise the module path's logits on dense and paged caches,
and the module path whenever something could observe or change it (grad mode, hooks, profile, autocast, a replaced
submodule)."""

from __future__ import annotations

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.autograd import no_grad
from tinylearn.inference import PagedKVCache, decode_fast
from tinylearn.inference.model import MLP, Attention, Block, TinyGPT

CLASSES = (Block, Attention, MLP)


def _model(cfg=(50, 32, 4, 2, 64, 2)) -> TinyGPT:
    tl.manual_seed(0)
    return TinyGPT(*cfg).eval()


def _decode(m: TinyGPT, ids: np.ndarray, fast: bool, cache=None) -> np.ndarray:
    cache = m.new_cache(ids.shape[0]) if cache is None else cache
    outs = []
    with no_grad():
        m(ids[:, :6], cache)
        for j in range(6, ids.shape[1]):
            handle = None if fast else m.ln_f.register_forward_hook(lambda mod, a, o: None)
            assert (decode_fast.eligible(m, CLASSES) is not None) == fast
            outs.append(m(ids[:, j : j + 1], cache).numpy())
            if handle is not None:
                handle.remove()
    return np.stack(outs)


@pytest.mark.parametrize("cfg", [(50, 32, 4, 2, 64, 2), (50, 32, 4, 2, 64, 4), (50, 32, 4, 2, 64, 1)])
def test_fast_path_is_bitwise_the_module_path(cfg):
    m = _model(cfg)
    ids = np.random.default_rng(0).integers(0, 50, (2, 10))
    np.testing.assert_array_equal(_decode(m, ids, True), _decode(m, ids, False))


def test_fast_path_on_a_paged_cache():
    m = _model()
    ids = np.random.default_rng(1).integers(0, 50, (1, 9))
    c = m.config
    pc = PagedKVCache(c.n_layers, c.kv_heads, c.head_dim, num_blocks=8, block_size=4)
    fast = _decode(m, ids, True, pc.model_cache(pc.new_sequence()))
    np.testing.assert_array_equal(fast, _decode(m, ids, False))


def test_module_path_whenever_it_could_differ():
    m = _model()
    with no_grad():
        assert decode_fast.eligible(m, CLASSES) is not None
        with tl.profile():
            assert None is decode_fast.eligible(m, CLASSES)  # the profiler sees every op
        with tl.amp.autocast("bfloat16"):
            assert None is decode_fast.eligible(m, CLASSES)
        m.blocks[0].attn.q_proj.register_forward_pre_hook(lambda mod, a: None)
        assert None is decode_fast.eligible(m, CLASSES)
    assert None is decode_fast.eligible(_model(), CLASSES)  # grad mode on
    m2 = _model()

    class MyLinear(tl.nn.Linear):
        pass

    m2.blocks[1].mlp.fc = MyLinear(32, 128)  # a replaced submodule (LoRA, quantised, ...)
    with no_grad():
        assert None is decode_fast.eligible(m2, CLASSES)
