"""The Triton paged-attention kernels (engine/gpu/paged_attention.py) against plain torch in float64.

Without a GPU they run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1), in float32
only: the interpreter has no 16-bit arithmetic. With a GPU the same cases run compiled on "cuda" in
float32, bfloat16 and float16. Every pool slot that no sequence owns, the other layer included, holds
NaN: a kernel that reads past a context, through a garbage table entry or from the wrong layer fails.
"""
from __future__ import annotations

import pytest
import torch

from raypd.engine.gpu import paged_attention as pa

LAYERS, LAYER = 2, 1

if torch.cuda.is_available():
    CASES = [("cuda", torch.float32), ("cuda", torch.bfloat16), ("cuda", torch.float16)]
else:
    CASES = [("cpu", torch.float32)]
CASES = [pytest.param(device, dtype, id=f"{device}-{str(dtype).removeprefix('torch.')}") for device, dtype in CASES]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}

# (query heads per KV head, KV heads, block size, head dim): GQA 1, 3 (SmolLM2), 4 and 8.
SHAPES = [(1, 2, 16, 16), (3, 3, 16, 32), (4, 2, 32, 16), (8, 1, 32, 32), (4, 1, 16, 64)]


def ids(shape: tuple[int, int, int, int]) -> str:
    return "g{}-kvh{}-bs{}-d{}".format(*shape)


class Pool:
    """A NaN pool with each sequence's first `lengths[s]` tokens filled at LAYER, in shuffled blocks;
    its tables are padded with the id of a block nobody owns (NaN too)."""

    def __init__(self, lengths: list[int], kvh: int, block_size: int, d: int, dtype: torch.dtype, device: str):
        self.block_size = block_size
        need = [-(-n // block_size) for n in lengths]
        width = max(need) + 3
        num_blocks = sum(need) + 2
        self.pool = torch.full((num_blocks, LAYERS, 2, kvh, block_size, d), float("nan"), dtype=dtype)
        perm = torch.randperm(num_blocks)
        self.tables = torch.full((len(lengths), width), int(perm[-1]), dtype=torch.int32)
        used = 0
        for s, (n, k) in enumerate(zip(lengths, need)):
            self.tables[s, :k] = perm[used:used + k].int()
            used += k
            blocks, offs = self._where(s, n)
            self.pool[blocks, LAYER, :, :, offs] = torch.randn(n, 2, kvh, d).to(dtype)
        self.pool = self.pool.to(device)
        self.tables = self.tables.to(device)

    def _where(self, s: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(n)
        return self.tables[s].cpu().long()[pos // self.block_size], pos % self.block_size

    def kv(self, s: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence s's first n keys and values, [n, KVH, D] each, in float64."""
        blocks, offs = self._where(s, n)
        kv = self.pool.cpu()[blocks, LAYER, :, :, offs].double()  # [n, 2, KVH, D]
        return kv[:, 0], kv[:, 1]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              scale: float) -> torch.Tensor:
    """q [n, H, D] at `positions` attending causally to k, v [ctx, KVH, D] in float64 -> [n, H, D]."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    visible = torch.arange(k.shape[0])[None, :] <= positions[:, None]
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, v)


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOL[dtype]
    torch.testing.assert_close(got.cpu().double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_decode_ragged_batch(device: str, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> None:
    g, kvh, block_size, d = shape
    torch.manual_seed(0)
    lengths = [1, 100, 0, 37, block_size]  # row 2 is a CUDA-graph padding row
    cache = Pool([max(n, 1) for n in lengths], kvh, block_size, d, dtype, device)
    q = torch.randn(len(lengths), kvh * g, d).to(dtype)
    q[2] = float("nan")  # the padding row's query is garbage too
    ctx = torch.tensor(lengths, dtype=torch.int32, device=device)
    scale = d ** -0.5
    out = pa.decode_attention(q.to(device), cache.pool, LAYER, cache.tables, ctx, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.equal(out[2].cpu(), torch.zeros_like(q[2]))
    for s, n in enumerate(lengths):
        if n:
            k, v = cache.kv(s, n)
            assert_close(out[s:s + 1], reference(q[s:s + 1], k, v, torch.tensor([n - 1]), scale), dtype)


@pytest.mark.parametrize("device,dtype", CASES)
def test_decode_many_splits_into_out(device: str, dtype: torch.dtype, monkeypatch) -> None:
    """More splits than the short sequences can use (stage 2 must skip those never written), results
    written into a given strided `out`, and the same rows with or without padding rows beside them."""
    monkeypatch.setattr(pa, "_DEFAULT_SMS", 1000)
    torch.manual_seed(1)
    lengths = [130, 3, 64, 65]
    cache = Pool(lengths, 2, 16, 32, dtype, device)
    q = torch.randn(len(lengths), 4, 32).to(dtype).to(device)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=device)
    assert pa._num_splits(len(lengths), 2, cache.tables.shape[1] * 16, torch.device(device)) >= 2
    out = torch.zeros(len(lengths), 4, 64, dtype=dtype, device=device)[:, :, ::2]
    res = pa.decode_attention(q, cache.pool, LAYER, cache.tables, ctx, 0.3, out=out)
    assert res.data_ptr() == out.data_ptr()
    for s, n in enumerate(lengths):
        k, v = cache.kv(s, n)
        assert_close(out[s:s + 1], reference(q[s:s + 1].cpu(), k, v, torch.tensor([n - 1]), 0.3), dtype)
    padded = torch.cat([ctx, torch.zeros(2, dtype=torch.int32, device=device)])
    tables = torch.cat([cache.tables, cache.tables[:2]])
    alone = pa.decode_attention(torch.cat([q, q[:2]]), cache.pool, LAYER, tables, padded, 0.3)
    assert torch.equal(alone[:4], out) and not alone[4:].any()


def test_split_count_follows_the_batch() -> None:
    cpu = torch.device("cpu")
    assert pa._num_splits(1, 8, 32768, cpu) > 16  # one long sequence: split to fill the GPU
    assert pa._num_splits(256, 8, 32768, cpu) == 1  # a full batch needs no splits
    assert pa._num_splits(1, 1, 40, cpu) == 1  # never more splits than key tiles
    # Every count is one of the compiled variants (powers of two), whatever the batch.
    counts = {pa._num_splits(b, 8, w * 16, cpu) for b in range(1, 300) for w in (1, 7, 64, 256)}
    assert counts <= set(pa.split_variants()) and len(counts) > 3


def test_compile_variants_writes_nothing() -> None:
    pool = torch.randn(4, 2, 2, 2, 16, 16)
    before = pool.clone()
    pa.compile_variants(pool, num_heads=4)
    assert torch.equal(pool, before)


def run_prefill(device: str, dtype: torch.dtype, shape: tuple[int, int, int, int], starts: list[int],
                q_lens: list[int]) -> None:
    g, kvh, block_size, d = shape
    cache = Pool([s + n for s, n in zip(starts, q_lens)], kvh, block_size, d, dtype, device)
    q = torch.randn(sum(q_lens), kvh * g, d).to(dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    scale = d ** -0.5
    out = pa.prefill_attention(q.to(device), cache.pool, LAYER, cu.to(device),
                               torch.tensor(starts, dtype=torch.int32, device=device), cache.tables,
                               max(q_lens), scale)
    assert out.shape == q.shape and out.dtype == dtype
    for s, (start, n) in enumerate(zip(starts, q_lens)):
        k, v = cache.kv(s, start + n)
        rows = slice(int(cu[s]), int(cu[s + 1]))
        assert_close(out[rows], reference(q[rows], k, v, torch.arange(start, start + n), scale), dtype)


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_prefill_after_cached_prefix(device: str, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> None:
    torch.manual_seed(2)
    # A long chunk after a prefix that ends mid-block, a single token, a chunk at position 0, a short one.
    run_prefill(device, dtype, shape, starts=[37, 70, 0, 16], q_lens=[60, 1, 9, 5])


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=ids)
def test_prefill_fresh_prompts(device: str, dtype: torch.dtype, shape: tuple[int, int, int, int]) -> None:
    torch.manual_seed(3)
    run_prefill(device, dtype, shape, starts=[0, 0, 0], q_lens=[90, 1, 33])


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_write_kv_writes_only_its_slots(device: str, dtype: torch.dtype, slot_dtype: torch.dtype) -> None:
    torch.manual_seed(4)
    kvh, block_size, d = 3, 16, 32
    pool = torch.randn(5, LAYERS, 2, kvh, block_size, d).to(dtype).to(device)
    qkv = torch.randn(6, (2 + 2 * kvh) * d).to(dtype).to(device)  # k, v as strided views of a fused projection
    k = qkv[:, 2 * d:(2 + kvh) * d].view(6, kvh, d)
    v = qkv[:, (2 + kvh) * d:].view(6, kvh, d)
    slots = torch.tensor([17, -1, 0, 79, 35, -1], dtype=slot_dtype, device=device)
    want = pool.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            want[slot // block_size, LAYER, 0, :, slot % block_size] = k[t]
            want[slot // block_size, LAYER, 1, :, slot % block_size] = v[t]
    pa.write_kv(pool, LAYER, k, v, slots)
    assert torch.equal(pool, want)


@pytest.mark.parametrize("device,dtype", CASES)
def test_write_then_attend(device: str, dtype: torch.dtype) -> None:
    """The engine's order: a chunk's K/V written through write_kv, then read back by prefill."""
    torch.manual_seed(5)
    kvh, block_size, d, n = 2, 16, 16, 21
    pool = torch.full((4, LAYERS, 2, kvh, block_size, d), float("nan"), dtype=dtype, device=device)
    table = torch.tensor([[3, 1, 0]], dtype=torch.int32, device=device)
    pos = torch.arange(n, device=device)
    slots = table[0, pos // block_size] * block_size + pos % block_size
    k, v, q = (torch.randn(n, h, d).to(dtype).to(device) for h in (kvh, kvh, 2 * kvh))
    pa.write_kv(pool, LAYER, k, v, slots)
    cu = torch.tensor([0, n], dtype=torch.int32, device=device)
    out = pa.prefill_attention(q, pool, LAYER, cu, torch.zeros(1, dtype=torch.int32, device=device), table, n, 0.25)
    assert_close(out, reference(q.cpu(), k.cpu().double(), v.cpu().double(), torch.arange(n), 0.25), dtype)
    last = pa.decode_attention(q[-1:], pool, LAYER, table, torch.tensor([n], dtype=torch.int32, device=device), 0.25)
    assert_close(last, out[-1:].cpu().double(), dtype)


def test_wrong_inputs_are_rejected() -> None:
    pool = torch.zeros(2, 1, 2, 2, 16, 16)
    q = torch.zeros(1, 4, 16)
    tables, ctx = torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="q must be"):
        pa.decode_attention(torch.zeros(1, 3, 16), pool, 0, tables, ctx, 1.0)
    with pytest.raises(ValueError, match="q must be torch.float32"):
        pa.decode_attention(q.half(), pool, 0, tables, ctx, 1.0)
    with pytest.raises(ValueError, match="ctx_lens must be"):
        pa.decode_attention(q, pool, 0, tables, ctx.float(), 1.0)
    with pytest.raises(ValueError, match="layer 1 is out of range"):
        pa.decode_attention(q, pool, 1, tables, ctx, 1.0)
    with pytest.raises(ValueError, match="pool must be"):
        pa.decode_attention(q, pool[0], 0, tables, ctx, 1.0)
    with pytest.raises(ValueError, match="cu_q must have shape"):
        pa.prefill_attention(q, pool, 0, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                             tables, 1, 1.0)
    with pytest.raises(ValueError, match="slots must have shape"):
        pa.write_kv(pool, 0, q[:, :2], q[:, :2], torch.zeros(2, dtype=torch.int32))
