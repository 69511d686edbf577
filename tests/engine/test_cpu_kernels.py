"""The CPU fast paths against plain torch: the C decode-attention kernel over a paged pool (float32
and bfloat16), and the prepacked oneDNN linear. No model; a tiny pool with the real layout.
The narrow-weight projections have their own file (test_weight_formats.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raypd.engine import LLM, ConfigError, SamplingParams
from raypd.engine.model import cpu_paths, native_attention, native_linear
from raypd.engine.model.linear import PackedLinear, packing_unavailable
from raypd.engine.model.native_attention import KernelUnavailable, NativeDecodeAttention
from tests.engine.rounding import U16, assert_within, float32_sum_bound

LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 3, 2, 64, 16


def reference(pool, layer, q, tables, ctx_lens):
    """Gather each request's context and attend in float64 (GQA: query head j reads KV head j // g)."""
    out = torch.empty_like(q)
    g = q.shape[1] // KV_HEADS
    for d, (table, ctx) in enumerate(zip(tables.tolist(), ctx_lens.tolist())):
        blocks = pool[table[:-(-ctx // BLOCK)], layer]  # [b, 2, KVH, bs, hd]
        k = blocks[:, 0].permute(1, 0, 2, 3).reshape(KV_HEADS, -1, HEAD_DIM)[:, :ctx].double()
        v = blocks[:, 1].permute(1, 0, 2, 3).reshape(KV_HEADS, -1, HEAD_DIM)[:, :ctx].double()
        for h in range(q.shape[1]):
            w = torch.softmax(k[h // g] @ q[d, h].double() * HEAD_DIM ** -0.5, dim=0)
            out[d, h] = (w @ v[h // g]).to(out.dtype)
    return out


def random_batch(rng, num_blocks, ctx_lens, heads, dtype=torch.float32):
    pool = torch.from_numpy(rng.standard_normal((num_blocks, LAYERS, 2, KV_HEADS, BLOCK, HEAD_DIM),
                                                dtype=np.float32)).to(dtype)
    width = max(-(-c // BLOCK) for c in ctx_lens)
    ids = rng.permutation(num_blocks)
    tables = np.full((len(ctx_lens), width), -1, dtype=np.int64)  # padding the kernel must never read
    used = 0
    for i, c in enumerate(ctx_lens):
        n = -(-c // BLOCK)
        tables[i, :n] = ids[used:used + n]
        used += n
    q = torch.from_numpy(rng.standard_normal((len(ctx_lens), heads, HEAD_DIM), dtype=np.float32)).to(dtype)
    return pool, q, torch.from_numpy(tables), torch.tensor(ctx_lens, dtype=torch.int64)


@pytest.mark.parametrize("heads", [2, 6])  # MHA and GQA with 3 query heads per KV head
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_decode_kernel_matches_gathered_attention(heads, threads):
    rng = np.random.default_rng(heads * 10 + threads)
    ctx_lens = [1, 15, 16, 17, 40, 100, 3]  # block edges, one-token and partial last blocks
    pool, q, tables, ctx = random_batch(rng, 40, ctx_lens, heads)
    before = pool.clone()
    kernel = NativeDecodeAttention(threads)
    for layer in range(LAYERS):
        torch.testing.assert_close(kernel(pool, layer, q, tables, ctx), reference(pool, layer, q, tables, ctx),
                                   atol=1e-5, rtol=1e-5)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("heads", [2, 6])
def test_bf16_decode_kernel_matches_gathered_attention(heads):
    # bf16 pool, q and output; the kernel sums in float32, so the only loss is the output's rounding.
    rng = np.random.default_rng(heads)
    ctx_lens = [1, 16, 17, 100, 3, 250]
    pool, q, tables, ctx = random_batch(rng, 60, ctx_lens, heads, torch.bfloat16)
    before = pool.clone()
    kernel = NativeDecodeAttention(2)
    for layer in range(LAYERS):
        out = kernel(pool, layer, q, tables, ctx)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, reference(pool, layer, q, tables, ctx), atol=1e-2, rtol=1e-2)
    assert torch.equal(pool, before)
    with pytest.raises(TypeError, match="q is torch.float32"):
        kernel(pool, 0, q.float(), tables, ctx)


def test_decode_kernel_is_the_same_on_any_thread_count():
    pool, q, tables, ctx = random_batch(np.random.default_rng(7), 64, [5, 300, 77, 160, 33, 250], 6)
    one = NativeDecodeAttention(1)(pool, 1, q, tables, ctx)
    assert torch.equal(one, NativeDecodeAttention(4)(pool, 1, q, tables, ctx))  # one task = one thread's sums


def test_supports_names_what_the_kernel_cannot_read():
    pool = torch.zeros(2, LAYERS, 2, KV_HEADS, BLOCK, HEAD_DIM)
    assert native_attention.supports(pool, 6) is None
    assert native_attention.supports(pool.bfloat16(), 6) is None
    assert "float16" in native_attention.supports(pool.half(), 6)
    assert "heads" in native_attention.supports(pool, 5)


def test_no_compiler_is_a_typed_error_and_auto_falls_back(monkeypatch, tmp_path, tiny_model_dir):
    # The tiny model (tests/tiny_model.py): the fallback is a matter of the kernels, not of the weights.
    monkeypatch.setenv("RAYPD_CACHE_DIR", str(tmp_path))  # nothing built yet in this cache
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    native_attention._load_library.cache_clear()
    native_linear._load_library.cache_clear()
    try:
        with pytest.raises(KernelUnavailable, match="no-such-cc"):
            NativeDecodeAttention(1)
        llm = LLM(tiny_model_dir, num_blocks=16)  # auto: packed linears still on, attention on the torch path
        assert llm.engine.decode_kernel is None and llm.engine.model.lm_head.packed
        assert llm.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0))[0].finish_reason
        # int8 without the kernel: the same format through F.linear, widened per call.
        assert type(LLM(tiny_model_dir, num_blocks=16, quantization="int8").engine.model.lm_head).__name__ \
            == "DequantizedLinear"
    finally:
        native_attention._load_library.cache_clear()  # later tests load the real build again
        native_linear._load_library.cache_clear()
    monkeypatch.undo()
    assert NativeDecodeAttention(1) is not None


def test_native_is_an_error_where_it_cannot_run(make_llm):
    with pytest.raises(ConfigError, match="cpu_kernels='native'"):
        make_llm(cpu_kernels="native", dtype="float16", num_blocks=8)
    with pytest.raises(ConfigError, match="cpu_kernels"):
        make_llm(cpu_kernels="fast", num_blocks=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 32, 300])
def test_packed_linear_matches_f_linear(dtype, rows):
    reason = packing_unavailable(torch.device("cpu"), dtype)
    if dtype == torch.bfloat16 and not _cpu_has_bf16_linear():
        # oneDNN's bf16 linear needs AVX-512 (bw/vl/dq) or AVX-NE-CONVERT: without them the probe
        # must say why, so the engine falls back to F.linear instead of crashing.
        assert reason is not None and "oneDNN" in reason
        return
    assert reason is None
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 48, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
    x = torch.randn(rows, 48, generator=g).to(dtype)
    for bias in (None, b):
        packed = PackedLinear(w, bias)
        assert packed.packed
        # oneDNN and ATen sum in their own orders: each within float32's bound of float64 (and a
        # bf16 output's own rounding), not within a tolerance of each other tuned on one CPU
        exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
        bound = float32_sum_bound(x, w) + (U16 * exact.abs() if dtype == torch.bfloat16 else 0)
        assert_within(packed(x), exact, bound)
        assert_within(F.linear(x, w, bias), exact, bound)


def _cpu_has_bf16_linear() -> bool:
    """oneDNN's bf16 linear runs on this CPU and the path the process is held to (cpu_paths.py)."""
    if cpu_paths.held().name in ("portable", "avx2"):  # oneDNN capped below AVX-512 and AVX-NE-CONVERT
        return False
    flags = cpu_paths.cpu_flags()
    return {"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags
