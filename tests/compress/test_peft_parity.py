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


def _torch_cnn(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 6, (3, 2), stride=2, padding=(1, 0)),
        torch.nn.Flatten(),
        torch.nn.Linear(6 * 4 * 3, 5),
    )


def _tl_cnn(tm):
    m = tl.nn.Sequential(
        tl.nn.Conv2d(3, 8, 3, padding=1),
        tl.nn.ReLU(),
        tl.nn.Conv2d(8, 6, (3, 2), stride=2, padding=(1, 0)),
        tl.nn.Flatten(),
        tl.nn.Linear(6 * 4 * 3, 5),
    )
    m.load_state_dict({k: v.detach().numpy().copy() for k, v in tm.state_dict().items()})
    return m


def test_conv_lora_matches_peft():
    """LoRAConv2d (the im2col view: A [r, in*kh*kw] as a conv, B as a 1x1 conv) against peft's LoRA Conv2d: forward,
    A/B and input gradients, merge_and_unload vs merge_lora, the adapter round-trip in peft's 4-D layout."""
    from tinylearn.compress.lora import LoRAConv2d, unmerge_lora

    tm = _torch_cnn()
    targets = ["0", "2", "4"]
    model = apply_lora(_tl_cnn(tm), targets, r=3, alpha=6)
    assert [type(m).__name__ for _, m in lora_layers(model)] == ["LoRAConv2d", "LoRAConv2d", "LoRALinear"]
    assert model[2].lora_A.shape == (3, 8 * 3 * 2) and model[2].lora_B.shape == (6, 3)
    pm = peft_wrap(tm, targets, r=3, alpha=6)
    from_peft_state_dict(model, pm.state_dict())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 8, 7)).astype(np.float32)
    gout = rng.standard_normal((4, 5)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    yp = pm(xt)
    (yp * torch.from_numpy(gout)).sum().backward()
    xg = tl.Tensor(x, requires_grad=True)
    y = model(xg)
    (y * tl.Tensor(gout)).sum().backward()
    np.testing.assert_allclose(y.data, yp.detach().numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(xg.grad.data, xt.grad.numpy(), rtol=RTOL, atol=ATOL)
    pg = {k: v.grad.numpy() for k, v in pm.named_parameters() if v.requires_grad}
    for n, m in lora_layers(model):
        for ab in ("lora_A", "lora_B"):
            theirs = pg[f"base_model.model.{n}.{ab}.default.weight"]
            np.testing.assert_allclose(getattr(m, ab).grad.data, theirs.reshape(getattr(m, ab).shape),
                                       rtol=RTOL, atol=ATOL, err_msg=f"{n}.{ab}")  # fmt: skip
    exported = to_peft_state_dict(model)
    assert exported["base_model.model.2.lora_A.default.weight"].shape == (3, 8, 3, 2)
    assert exported["base_model.model.2.lora_B.default.weight"].shape == (6, 3, 1, 1)
    for k, v in exported.items():
        np.testing.assert_array_equal(v, pm.state_dict()[k].numpy())
    with torch.no_grad():
        y_unmerged = pm(torch.from_numpy(x)).numpy()
        merged_t = pm.merge_and_unload()
    merge_lora(model)
    with tl.no_grad():
        y_merged = model(tl.Tensor(x)).data
    np.testing.assert_allclose(
        model[2].base_layer.weight.data, merged_t[2].weight.detach().numpy(), rtol=RTOL, atol=1e-6
    )
    np.testing.assert_allclose(y_merged, y_unmerged, rtol=RTOL, atol=ATOL)
    unmerge_lora(model)
    w0 = _torch_cnn()[0].weight.detach().numpy()  # tm itself was merged in place by merge_and_unload
    np.testing.assert_allclose(model[0].base_layer.weight.data, w0, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="groups=1"):
        LoRAConv2d(tl.nn.Conv2d(4, 4, 3, groups=2), r=2, alpha=4)
    with pytest.raises(ValueError, match="im2col"):
        apply_lora(_tl_cnn(tm), ["0"], r=28, alpha=4)  # 3 * 3 * 3 = 27 < 28


def test_conv_lora_dilated_merge_is_exact():
    """With dilation the adapter's A conv must use the base conv's dilation for B.A to be the update of W (peft
    0.21's LoRA Conv2d builds lora_A without it, so its merged and unmerged outputs differ there; no parity test).
    tinylearn: the merged conv equals the two-branch forward, and the branch equals a conv with scaling B.A."""
    from tinylearn.compress.lora import unmerge_lora

    tl.manual_seed(0)
    model = apply_lora(tl.nn.Sequential(tl.nn.Conv2d(3, 5, (3, 2), stride=(1, 2), padding=1, dilation=(2, 3))),
                       ["0"], r=2, alpha=3)  # fmt: skip
    layer = model[0]
    layer.lora_B.data[:] = np.random.default_rng(1).standard_normal(layer.lora_B.shape).astype(np.float32)
    x = tl.Tensor(np.random.default_rng(2).standard_normal((2, 3, 9, 11)).astype(np.float32))
    y = model(x).data
    delta = layer.delta_weight().reshape(layer.base_layer.weight.shape)
    branch = tl.nn.functional.conv2d(x, tl.Tensor(delta), None, (1, 2), 1, (2, 3)).data
    np.testing.assert_allclose(y - layer.base_layer(x).data, branch, rtol=RTOL, atol=ATOL)
    merge_lora(model)
    np.testing.assert_allclose(model(x).data, y, rtol=RTOL, atol=ATOL)
    unmerge_lora(model)
    np.testing.assert_allclose(model(x).data, y, rtol=RTOL, atol=ATOL)
