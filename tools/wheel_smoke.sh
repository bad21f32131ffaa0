#!/usr/bin/env bash
# Installable as a package, not only as a checkout: build the wheel with `pip wheel .`, install it into a fresh
# venv outside the repository and use it from there (called by .ci/run; `make wheel-smoke`).
#
#  1. `pip wheel . --no-deps` (portable: TINYLEARN_NATIVE=OFF) into a temp folder; the wheel must hold _C, every
#     cuda_src/*.cu and every exercises/ file.
#  2. `python -m venv` (no system site-packages) outside the repo; `pip install --no-deps` of that wheel. The
#     third-party dependencies (torch, tinygrad, numpy ...) are not downloaded again: one .pth line appends the
#     project .venv's site-packages to the END of sys.path (only plain paths: the editable tinylearn's finder in
#     .venv is not loaded), so `tinylearn` itself can only come from the wheel — checked below.
#  3. From a folder outside the repo: import, one op per topic against torch/numpy, the cuda source lookup,
#     `tinylearn bench matmul --size 64`, `tinylearn exercises copy` + `tinylearn check` (reference and stubs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv_py="${PYTHON:-$root/.venv/bin/python}"
work=$(mktemp -d "${TMPDIR:-/tmp}/tinylearn-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)
say() { echo "wheel-smoke [$(( $(date +%s) - t0 )) s]: $*"; }

# 1. build (own build dir, kept under build/ so a second run is incremental; serialised with tools/build.sh)
mkdir -p "$root/build"
(
  flock 9
  cd "$root"
  TINYLEARN_NATIVE=OFF "$venv_py" -m pip wheel . --no-deps --no-build-isolation -q -w "$work/dist" \
    -C build-dir=build/wheel-smoke
) 9>"$root/build/.lock"
whl=$(ls "$work"/dist/tinylearn-*.whl)
say "built $(basename "$whl") ($(du -h "$whl" | cut -f1))"
"$venv_py" - "$whl" "$root" <<'EOF'
import sys, zipfile
from pathlib import Path
whl, root = sys.argv[1], Path(sys.argv[2])
names = set(zipfile.ZipFile(whl).namelist())
need = {f"tinylearn/cuda_src/{p.name}" for p in (root / "cuda_src").glob("*.cu")}
need |= {f"tinylearn/exercises/{p.relative_to(root / 'exercises')}" for p in (root / "exercises").rglob("*.py")
         if "__pycache__" not in p.parts}
missing = sorted(need - names)
assert not missing, f"wheel lacks {missing[:10]} ({len(missing)} files)"
assert any(n.startswith("tinylearn/_C.") and n.endswith(".so") for n in names), "wheel lacks tinylearn/_C"
assert not any("__pycache__" in n for n in names), "wheel carries __pycache__"
print(f"wheel-smoke: wheel holds _C, {sum(n.startswith('tinylearn/cuda_src/') for n in names)} CUDA sources, "
      f"{sum(n.startswith('tinylearn/exercises/') for n in names)} exercise files")
EOF

# 2. fresh venv outside the repo
"$venv_py" -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --no-deps --no-index "$whl"
deps=$("$venv_py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$deps" >"$site/zz_tinylearn_smoke_deps.pth"
say "installed into $work/venv (dependencies from $deps, appended after the venv's own site-packages)"

# 3. use it from outside the checkout
mkdir -p "$work/user" && cd "$work/user"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
"$py" - "$root" "$site" <<'EOF'
import sys
from pathlib import Path

import numpy as np
import torch

root, site = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
import tinylearn as tl
from tinylearn import _resources

where = Path(tl.__file__).resolve()
assert where.is_relative_to(site), f"tinylearn imported from {where}, not from the wheel in {site}"
assert _resources.checkout_root() is None, "a wheel install must not see a checkout"
import tinylearn._C as C

assert Path(C.__file__).resolve().is_relative_to(site)
rng = np.random.default_rng(0)

# cuda sources: the packaged copies, identical to the repository's
from tinylearn.kernels import cuda as kc

src = kc.source_path("kernels_softmax")
assert src.resolve().is_relative_to(site) and "__global__" in src.read_text()
for p in (root / "cuda_src").glob("*.cu"):
    assert _resources.cuda_source(p.stem).read_bytes() == p.read_bytes(), p.name

# one op per topic
x = tl.Tensor(rng.standard_normal((3, 4)), requires_grad=True)  # autograd
(x.tanh() * x).sum().backward()
tx = torch.tensor(x.data, requires_grad=True)
(tx.tanh() * tx).sum().backward()
np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)

xi = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)  # conv (C++ im2col)
w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
ref = torch.nn.functional.conv2d(torch.from_numpy(xi), torch.from_numpy(w), padding=1).numpy()
np.testing.assert_allclose(tl.conv.conv2d(xi, w, padding=1, backend="cpp"), ref, rtol=1e-4, atol=1e-4)

a = rng.integers(-128, 128, (17, 40), dtype=np.int8)  # quant: exact int8 GEMM in C++
b = rng.integers(-128, 128, (40, 9), dtype=np.int8)
np.testing.assert_array_equal(tl.quant.int8_gemm(a, b, backend="cpp"), a.astype(np.int64) @ b.astype(np.int64))

lin = tl.nn.Linear(8, 8)  # prune
tl.prune.l1_unstructured(lin, "weight", amount=0.5)
assert abs(tl.prune.sparsity(lin.weight.data) - 0.5) < 0.02

s = rng.standard_normal((5, 33)).astype(np.float32)  # kernels: fused softmax in C++
np.testing.assert_allclose(tl.kernels.softmax(s, backend="cpu"), torch.softmax(torch.from_numpy(s), -1).numpy(),
                           rtol=1e-5, atol=1e-6)

t_ring = tl.dist.cost_model.predict("ring", 1 << 20, 4, 1e-5, 1e-10)  # dist: model == simulator
assert abs(tl.dist.simulate("ring", 4, 1 << 20, alpha_s=1e-5, beta_s_per_byte=1e-10) - t_ring) <= 1e-9 * t_ring + 1e-12

alloc = tl.memory.BumpAllocator(4096, backend="cpp")  # memory: C++ allocator
o1, o2 = alloc.malloc(100), alloc.malloc(100)
assert o2 > o1 and alloc.stats()["allocated"] >= 200
ca = rng.standard_normal((64, 33)).astype(np.float32)  # compiler: generated C++, built by g++ at first call
cb = rng.standard_normal((64, 33)).astype(np.float32)
fc = tl.compile(lambda u, v: tl.nn.functional.gelu(u) * 1.5 + v)
ref = (torch.nn.functional.gelu(torch.from_numpy(ca)) * 1.5 + torch.from_numpy(cb)).numpy()
np.testing.assert_allclose(fc(tl.Tensor(ca), tl.Tensor(cb)).numpy(), ref, rtol=1e-5, atol=1e-5)
assert len(fc.graphs()[-1].kernels()) == 1, fc.explain()

gm = tl.inference.TinyGPT(64, 32, 2, 2, 64)  # serve: continuous batching over the paged KV cache (C++ decode kernel)
outs = tl.serve.Engine(gm).generate([[1, 2, 3], [4, 5, 6, 7, 8]], tl.serve.SamplingParams(temperature=0, max_tokens=5))
assert [o.token_ids for o in outs] == [tl.inference.generate(gm, p, 5) for p in ([1, 2, 3], [4, 5, 6, 7, 8])]

wq = rng.standard_normal((16, 64)).astype(np.float32)  # compress: NF4 weights, C++ dequantize-on-the-fly matmul
xq = rng.standard_normal((3, 64)).astype(np.float32)
q4 = tl.compress.nf4_quantize(wq)
np.testing.assert_allclose(tl.compress.nf4_matmul(xq, q4, backend="cpp"), xq @ tl.compress.nf4_dequantize(q4).T,
                           rtol=1e-4, atol=1e-4)

import tempfile  # noqa: E402  resilience: a sharded checkpoint, erasure-coded by the C++ GF(2^8) kernel, one file lost
ck = tempfile.mkdtemp() + "/step_00000001"
wr = rng.standard_normal(1000).astype(np.float32)
for r_ in range(3):  # three ranks' shards of one flat tensor, saved one after another in this process
    tl.resilience.save_sharded({"w": tl.resilience.Shard(wr[r_ * 334 : (r_ + 1) * 334], (r_ * 334,), (1000,))}, ck,
                               rank=r_, world_size=3)
tl.resilience.protect(ck, 1, backend="cpp")
import os  # noqa: E402
os.remove(ck + "/rank00001.bin")
assert tl.resilience.repair(ck, backend="cpp")
assert np.array_equal(tl.resilience.load_sharded(ck)["w"], wr)

import torch  # noqa: E402  longctx: block-sparse attention (C++ kernel, empty tiles skipped) vs masked torch SDPA
qs = [rng.standard_normal((1, 2, 128, 16)).astype(np.float32) for _ in range(3)]
pat = tl.longctx.local(1) | tl.longctx.global_tokens(16)
ref = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, qs),
                                                       attn_mask=torch.from_numpy(pat.layout(128, 128, 32).dense_mask()))
out = tl.longctx.block_sparse_attention(*qs, pat, block_size=32, backend="cpp")
np.testing.assert_allclose(np.asarray(out), ref.numpy(), rtol=1e-4, atol=1e-5)

ga = rng.standard_normal((64, 64)).astype(np.float32)  # tune + profile: a tuned GEMM (C++ blocking knobs), profiled
res = tl.tune.tune("gemm.matmul", {"M": 64, "N": 64, "K": 64}, budget=3, repeat=1, warmup=0, store=False)
assert res.best_s is not None and not res.rejected, res.rejected
with tl.profile() as prof:
    tl.gemm.matmul(ga, ga)
assert prof.key_averages().row("gemm.matmul").count == 1
print("wheel-smoke: import, one op per topic, cuda source lookup: ok")
EOF
say "python smoke ok"
"$work/venv/bin/tinylearn" info | grep -E "^(tinylearn|_C|resources)" 
"$work/venv/bin/tinylearn" bench matmul --size 64 >"$work/bench.txt"
grep -q "torch" "$work/bench.txt" || { cat "$work/bench.txt"; echo "wheel-smoke: bench printed no torch column"; exit 1; }
head -12 "$work/bench.txt"
say "bench ok"
"$work/venv/bin/tinylearn" exercises copy "$work/user/ex"
cd "$work/user/ex"
# one folder both ways (08_gemm: the quickest; the copy and the lookup are the same for every folder)
"$work/venv/bin/tinylearn" check 08_gemm --impl=reference
if "$work/venv/bin/tinylearn" check gemm >"$work/stub.txt"; then
  cat "$work/stub.txt"; echo "wheel-smoke: the untouched stubs passed (they must fail)"; exit 1
fi
grep -q "not written yet\|NotImplementedError" "$work/stub.txt" || { cat "$work/stub.txt"; exit 1; }
say "exercises copy + check ok (reference passes, untouched stubs fail)"
say "all ok"
