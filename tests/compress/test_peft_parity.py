"""Parity with peft (the oracle): same base weights + same A/B -> same outputs, A/B gradients, merged outputs;
adapter weights round-trip between tinylearn and peft names; fp64 gradcheck of LoRALinear."""

import numpy as np
import pytest

import tinylearn as tl
from tinylearn.compress.lora import LoRALinear, apply_lora, lora_layers, merge_lora
from tinylearn.compress.peft_compat import from_peft_state_dict, to_peft_model, to_peft_state_dict

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

RTOL, ATOL = 1e-5, 1e-5  # fp32 (DESIGN.md: 1e-5 / 1e-4 reductions; sums here are a few hundred terms)


def torch_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def tl_mlp(tm):
    m = tl.nn.Sequential(tl.nn.Linear(16, 32), tl.nn.ReLU(), tl.nn.Linear(32, 8))
    m.load_state_dict(tm.state_dict())
    return m


def peft_wrap(tm, targets, r, alpha, seed=7):
    pm = peft.get_peft_model(tm, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if ".lora_B." in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return pm


def grads_match(pm, model):
    pg = {k: v.grad.numpy() for k, v in pm.named_parameters() if v.requires_grad}
    tg = {
        f"base_model.model.{n}.{ab}.default.weight": getattr(m, ab).grad.numpy()
        for n, m in lora_layers(model)
        for ab in ("lora_A", "lora_B")
    }
    assert set(pg) == set(tg)
    for k in pg:
        np.testing.assert_allclose(tg[k], pg[k], rtol=RTOL, atol=ATOL, err_msg=k)


def test_mlp_forward_grads_merge_match_peft():
    tm = torch_mlp()
    model = apply_lora(tl_mlp(tm), ["0", "2"], r=4, alpha=8)
    pm = peft_wrap(tm, ["0", "2"], r=4, alpha=8)
    from_peft_state_dict(model, pm.state_dict())
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    gout = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    yp = pm(torch.from_numpy(x))
    (yp * torch.from_numpy(gout)).sum().backward()
    y = model(tl.Tensor(x))
    (y * tl.Tensor(gout)).sum().backward()
    np.testing.assert_allclose(y.numpy(), yp.detach().numpy(), rtol=RTOL, atol=ATOL)
    grads_match(pm, model)
    # frozen base: neither side has base grads
    assert all(not p.requires_grad for n, p in pm.named_parameters() if "base_layer" in n)
    assert all(m.base_layer.weight.grad is None for _, m in lora_layers(model))
    # merged outputs equal peft's merge_and_unload
    merged_torch = pm.merge_and_unload()
    merge_lora(model)
    with torch.no_grad():
        ym = merged_torch(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model(tl.Tensor(x)).numpy(), ym, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        model[0].base_layer.weight.data, merged_torch[0].weight.detach().numpy(), rtol=RTOL, atol=1e-6
    )


def test_adapter_roundtrip_both_ways():
    tm = torch_mlp(1)
    model = apply_lora(tl_mlp(tm), ["0", "2"], r=2, alpha=4)
    model2 = apply_lora(tl_mlp(tm), ["0", "2"], r=2, alpha=4)
    pm = peft_wrap(tm, ["0", "2"], r=2, alpha=4, seed=3)  # get_peft_model rewrites tm in place
    from_peft_state_dict(model, pm.state_dict())
    exported = to_peft_state_dict(model)
    psd = {k: v for k, v in pm.state_dict().items() if ".lora_" in k}
    assert set(exported) == set(psd)
    for k in psd:
        np.testing.assert_array_equal(exported[k], psd[k].numpy())
    # tinylearn -> peft: a fresh peft model loaded from our adapter computes our outputs
    pm2 = to_peft_model(torch_mlp(1), model)
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(model(tl.Tensor(x)).numpy(), pm2(torch.from_numpy(x)).numpy(), rtol=RTOL, atol=ATOL)
    # save_pretrained spelling (no adapter name) is accepted too
    short = {k.replace(".default", ""): v for k, v in psd.items()}
    from_peft_state_dict(model2, short)
    np.testing.assert_array_equal(model2[2].lora_B.data, model[2].lora_B.data)
    with pytest.raises(KeyError, match="missing"):
        from_peft_state_dict(model2, {k: v for k, v in psd.items() if not k.startswith("base_model.model.2.")})


def test_tinygpt_block_matches_peft():
    from tinylearn.inference import GPTConfig, TinyGPT, torch_reference

    cfg = GPTConfig(vocab_size=37, d_model=16, n_heads=2, n_layers=2, max_seq_len=12)
    torch.manual_seed(0)
    tm = torch_reference(cfg)
    model = TinyGPT.from_config(cfg)
    model.load_torch_state_dict(tm.state_dict())
    targets = ["q_proj", "v_proj", "fc"]
    apply_lora(model, targets, r=4, alpha=16)
    pm = peft_wrap(tm, targets, r=4, alpha=16, seed=11)
    from_peft_state_dict(model, pm.state_dict())
    assert len(lora_layers(model)) == 6
    ids = np.random.default_rng(0).integers(0, 37, size=(2, 9))
    gout = np.random.default_rng(1).standard_normal((2, 9, 37)).astype(np.float32)
    yp = pm(torch.from_numpy(ids))
    (yp * torch.from_numpy(gout)).sum().backward()
    y = model(ids)
    (y * tl.Tensor(gout)).sum().backward()
    np.testing.assert_allclose(y.numpy(), yp.detach().numpy(), rtol=1e-4, atol=1e-5)
    pg = {k: v.grad.numpy() for k, v in pm.named_parameters() if v.requires_grad}
    for n, m in lora_layers(model):
        for ab in ("lora_A", "lora_B"):
            np.testing.assert_allclose(
                getattr(m, ab).grad.numpy(),
                pg[f"base_model.model.{n}.{ab}.default.weight"],
                rtol=1e-4,
                atol=1e-5,
                err_msg=n,
            )
    merged = pm.merge_and_unload()
    merge_lora(model)
    with torch.no_grad():
        np.testing.assert_allclose(model(ids).numpy(), merged(torch.from_numpy(ids)).numpy(), rtol=1e-4, atol=1e-5)


def test_gradcheck_fp64():
    tl.manual_seed(0)
    layer = LoRALinear(tl.nn.Linear(5, 4, dtype=np.float64), r=2, alpha=3)
    rng = np.random.default_rng(0)
    layer.lora_B.data[...] = rng.standard_normal((4, 2))
    x = tl.Tensor(rng.standard_normal((3, 5)), requires_grad=True)
    assert tl.autograd.gradcheck(lambda x, a, b: layer(x), [x, layer.lora_A, layer.lora_B])
    assert layer.lora_A.dtype == np.float64
