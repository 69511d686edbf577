"""The fused decode layers (native_decoder.py) against llama.py's layer loop on a tiny random Llama:
the same logits and the same K/V written into the pool, for a decode-only step. No checkpoint."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from raypd.engine.cache.kv_cache import PagedKVCache
from raypd.engine.model.attention import AttentionMetadata, DecodeBatch, PrefillSegment
from raypd.engine.model.config import ModelConfig
from raypd.engine.model.linear import ROW_SPLIT_MIN_ROWS, LinearFactory
from raypd.engine.model.llama import LayerWeights, LlamaModel, ModelWeights
from raypd.engine.model.native_attention import NativeDecodeAttention
from raypd.engine.model.native_decoder import NativeDecoder
from tests.engine.cpu_support import require_bf16_packing

CPU = torch.device("cpu")
BLOCK, NUM_BLOCKS = 16, 24


def tiny_config(bias: bool) -> ModelConfig:
    return ModelConfig(vocab_size=80, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=6, num_kv_heads=2,
                       head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                       max_position_embeddings=512, tie_word_embeddings=True, attention_bias=bias, eos_token_ids=(0,),
                       bos_token_id=None)


def tiny_model(cfg: ModelConfig, dtype: torch.dtype, linears: LinearFactory, seed: int = 0) -> LlamaModel:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    layers = [LayerWeights(input_norm=1 + rand(cfg.hidden_size), qkv=rand(qkv_rows, cfg.hidden_size),
                           qkv_bias=rand(qkv_rows) if cfg.attention_bias else None,
                           o=rand(cfg.hidden_size, cfg.num_heads * cfg.head_dim), post_norm=1 + rand(cfg.hidden_size),
                           gate_up=rand(2 * cfg.intermediate_size, cfg.hidden_size),
                           down=rand(cfg.hidden_size, cfg.intermediate_size))
              for _ in range(cfg.num_layers)]
    embed = rand(cfg.vocab_size, cfg.hidden_size, scale=1.0)
    weights = ModelWeights(embed=embed, layers=layers, norm=1 + rand(cfg.hidden_size), lm_head=embed)
    return LlamaModel(cfg, weights, CPU, dtype, linears=linears)


def decode_step(cfg: ModelConfig, kv: PagedKVCache, ctx_lens: list[int], seed: int = 1):
    """Inputs of a decode-only step: each request's new token sits at position ctx - 1 of its own blocks."""
    rng = np.random.default_rng(seed)
    blocks = rng.permutation(NUM_BLOCKS)
    width = max(-(-c // BLOCK) for c in ctx_lens)
    tables = np.zeros((len(ctx_lens), width), dtype=np.int64)
    write, used = [], 0
    for i, ctx in enumerate(ctx_lens):
        n = -(-ctx // BLOCK)
        tables[i, :n] = blocks[used:used + n]
        used += n
        pos = ctx - 1
        runs = np.arange(cfg.num_kv_heads) + tables[i, pos // BLOCK] * kv.runs_per_block
        write.append(runs * BLOCK + pos % BLOCK)
    d = len(ctx_lens)
    meta = AttentionMetadata(
        write_slots=torch.from_numpy(np.concatenate(write)), prefills=(),
        decode=DecodeBatch(q_index=torch.arange(d), kernel=NativeDecodeAttention(2), tables=torch.from_numpy(tables),
                           ctx_lens=torch.tensor(ctx_lens, dtype=torch.int64)))
    ids = torch.from_numpy(rng.integers(1, cfg.vocab_size, d))
    return ids, torch.tensor([c - 1 for c in ctx_lens]), meta


def run_step(model: LlamaModel, cfg: ModelConfig, dtype: torch.dtype, ctx_lens: list[int]):
    """One decode-only step on a pool of seeded random KV: (logits, the pool after the step)."""
    kv = PagedKVCache(cfg, NUM_BLOCKS, BLOCK, dtype, CPU)
    kv.pool.copy_(torch.randn(kv.pool.shape, generator=torch.Generator().manual_seed(2)).to(dtype))
    ids, positions, meta = decode_step(cfg, kv, ctx_lens)
    assert NativeDecoder.serves(meta)
    with torch.inference_mode():
        logits = model.forward(ids, positions, meta, kv, torch.arange(len(ctx_lens)))
    return logits, kv.pool.float()


def int16_rounding_effect(cfg: ModelConfig, fmt: str, ctx_lens: list[int], loop: tuple) -> tuple[float, float]:
    """How far the layer loop's int16 rounding of activations moves (logits, KV) on this model: the
    loop against the same int8 weights multiplied with float32 activations (DequantizedLinear)."""
    exact = run_step(tiny_model(cfg, torch.float32, LinearFactory("dequantized", fmt)), cfg, torch.float32, ctx_lens)
    return tuple((a - b).abs().max().item() for a, b in zip(loop, exact))  # type: ignore[return-value]


@pytest.mark.parametrize("dtype, fmt, bias", [
    (torch.float32, "int8", False), (torch.float32, "int8", True), (torch.float32, "bfloat16", False),
    (torch.float32, "int8-g32", True), (torch.bfloat16, "int8-g32", False),
    (torch.bfloat16, "bfloat16", True), (torch.bfloat16, "int8", False)])
@pytest.mark.parametrize("ctx_lens", [[1], [17, 40, 3, 16, 33, 5, 64, 2, 20]])  # one row; rows in parallel
def test_fused_layers_compute_what_the_layer_loop_does(dtype, fmt, bias, ctx_lens):
    cfg = tiny_config(bias)
    model = tiny_model(cfg, dtype, LinearFactory("native", fmt, 2))
    decoder = model.decoder  # the model takes the fused layers for itself when all projections are native
    assert isinstance(decoder, NativeDecoder), NativeDecoder.for_layers(cfg, model.layers, dtype, 2)
    model.decoder = None  # llama.py's layer loop
    expected, expected_pool = loop = run_step(model, cfg, dtype, ctx_lens)
    model.decoder = decoder
    got, got_pool = run_step(model, cfg, dtype, ctx_lens)
    scale = expected.abs().max().item()
    if dtype == torch.bfloat16:
        # One rounding flip moves a value by a bf16 step, and that propagates through the layers.
        atol, kv_atol, rtol = 5e-2 * scale, 0.5, 5e-2
    elif fmt == "bfloat16":
        # float32 activations times bf16 weights, summed in float32: only the order of sums differs
        # (the C loop's norms and rotary against ATen's vectorized ones, each instruction set its own).
        atol, kv_atol, rtol = 1e-4 * scale, 1e-3, 1e-4
    else:
        # int8 weights: both paths round each projection's input to int16 steps (2^-15 of the row's
        # largest value, narrow_linear.c) before summing exactly in integers. float32 sums taken in
        # another order can put an element on the neighbouring step: the paths may differ by one step
        # per element where each is within half a step of float arithmetic on the same int8 weights.
        # So the tolerance is that half-step rounding's measured effect on this model, twice for a
        # whole step, twice again for rounding signs that happen to line up; float32 order is ~1e-6.
        effect, kv_effect = int16_rounding_effect(cfg, fmt, ctx_lens, loop)
        atol, kv_atol, rtol = 4 * effect + 1e-5 * scale, 4 * kv_effect + 1e-5, 0.0
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    torch.testing.assert_close(got_pool, expected_pool, atol=kv_atol, rtol=rtol)


def test_layers_it_cannot_compute_are_refused():
    cfg = tiny_config(False)
    onednn = tiny_model(cfg, torch.float32, LinearFactory("onednn"))
    assert "narrow-weight kernel" in NativeDecoder.for_layers(cfg, onednn.layers, torch.float32, 2)
    native = tiny_model(cfg, torch.float32, LinearFactory("native", "int8", 2))
    assert "bfloat16 activations" in NativeDecoder.for_layers(cfg, native.layers, torch.bfloat16, 2)  # they are float32

    @dataclasses.dataclass
    class NormedLayer:  # a layer with a weight the C loop does not know (say a q/k norm)
        input_norm: torch.Tensor
        qkv: object
        o: object
        post_norm: torch.Tensor
        gate_up: object
        down: object
        q_norm: torch.Tensor | None

    lw = native.layers[0]
    layer = NormedLayer(lw.input_norm, lw.qkv, lw.o, lw.post_norm, lw.gate_up, lw.down, torch.ones(16))
    assert "q_norm" in NativeDecoder.for_layers(cfg, [layer] * cfg.num_layers, torch.float32, 2)
    layer.q_norm = None  # present but unused: nothing is skipped
    assert isinstance(NativeDecoder.for_layers(cfg, [layer] * cfg.num_layers, torch.float32, 2), NativeDecoder)


def test_only_decode_only_steps_on_the_native_path_are_served():
    decode = DecodeBatch(q_index=torch.arange(1), kernel=NativeDecodeAttention(1), tables=torch.zeros(1, 1,
                         dtype=torch.int64), ctx_lens=torch.ones(1, dtype=torch.int64))
    slots = torch.zeros(2, dtype=torch.int64)
    assert NativeDecoder.serves(AttentionMetadata(slots, (), decode))
    assert not NativeDecoder.serves(AttentionMetadata(slots, (PrefillSegment(1, 3, 0, None, None),), decode))
    torch_path = DecodeBatch(q_index=torch.arange(1), context_runs=torch.zeros(1, dtype=torch.int64))
    assert not NativeDecoder.serves(AttentionMetadata(slots, (), torch_path))
    assert not NativeDecoder.serves(AttentionMetadata(slots, (), None))


@pytest.mark.parametrize("ctx_lens", [[17, 40, 3], [17, 40, 3, 16, 33, 5, 64, 2, 20]])  # below and above the split
def test_row_split_models_fuse_only_small_decode_steps_and_compute_the_same(ctx_lens):
    require_bf16_packing()
    cfg = tiny_config(True)
    split = tiny_model(cfg, torch.bfloat16, LinearFactory("row-split", "bfloat16", 2))
    native = tiny_model(cfg, torch.bfloat16, LinearFactory("native", "bfloat16", 2))
    assert isinstance(split.decoder, NativeDecoder) and split.decoder.max_rows == ROW_SPLIT_MIN_ROWS - 1
    assert split.decoder.fits(ROW_SPLIT_MIN_ROWS - 1) and not split.decoder.fits(ROW_SPLIT_MIN_ROWS)
    kvs = [PagedKVCache(cfg, NUM_BLOCKS, BLOCK, torch.bfloat16, CPU) for _ in range(2)]
    kvs[0].pool.copy_(torch.randn(kvs[0].pool.shape, generator=torch.Generator().manual_seed(2)).bfloat16())
    kvs[1].pool.copy_(kvs[0].pool)
    ids, positions, meta = decode_step(cfg, kvs[0], ctx_lens)
    with torch.inference_mode():
        got = split.forward(ids, positions, meta, kvs[0], torch.arange(len(ctx_lens)))
        expected = native.forward(ids, positions, meta, kvs[1], torch.arange(len(ctx_lens)))
    scale = expected.abs().max().item()
    torch.testing.assert_close(got, expected, atol=5e-2 * scale, rtol=5e-2)
    torch.testing.assert_close(kvs[0].pool.float(), kvs[1].pool.float(), atol=0.5, rtol=5e-2)
