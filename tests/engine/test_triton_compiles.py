"""engine/gpu/triton_compiles.py against Triton's JIT hooks: installed for the block and the previous
hooks put back after it; a compile recorded with its kernel, signature and time. Triton compiles
nothing on this CPU (its interpreter runs the kernels), so the hooks are called as Triton calls them."""
from __future__ import annotations

from types import SimpleNamespace

from triton import knobs

from raypd.engine.gpu.triton_compiles import TritonCompiles


def test_the_hooks_record_each_compile_and_are_restored_after():
    def earlier(**_):
        return None
    knobs.runtime.jit_cache_hook = earlier
    try:
        with TritonCompiles() as compiles:
            assert compiles.available and knobs.runtime.jit_cache_hook is not earlier
            # Triton: the cache hook before building a variant (a true answer would skip it), the
            # post-compile hook after.
            assert not knobs.runtime.jit_cache_hook(key=("k", 1), repr="_decode_kernel[...]", fn=None)
            knobs.runtime.jit_post_compile_hook(key=("k", 1), repr="_decode_kernel[...]",
                                                fn=SimpleNamespace(name="_decode_kernel"), compile={})
        assert knobs.runtime.jit_cache_hook is earlier and knobs.runtime.jit_post_compile_hook is None
    finally:
        knobs.runtime.jit_cache_hook = None
    (c,) = compiles.compiles
    assert (c.kernel, c.signature) == ("_decode_kernel", "_decode_kernel[...]") and c.seconds >= 0
    assert compiles.summary()["count"] == 1
