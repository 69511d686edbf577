"""Which Triton kernels compiled while a piece of work ran, and for how long: a compile inside a
measured run stalls its step for 0.3-1 s, so a benchmark reports every one (none should happen
after the engine's warm-up: engine/gpu/runner.py, paged_attention.compile_variants).

Triton calls knobs.runtime.jit_cache_hook before it builds a kernel variant this process has not
built (from its disk cache or by compiling) and jit_post_compile_hook after; the span between is
what the launch waited. Under TRITON_INTERPRET=1 nothing is compiled and nothing is recorded.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class KernelCompile:
    kernel: str       # the @triton.jit function's name
    signature: str    # its argument types and specializations
    seconds: float


@dataclass(slots=True)
class TritonCompiles:
    """`with TritonCompiles() as compiles:` records every kernel variant built inside; not reentrant.
    available is False where this Triton has no such hooks (nothing is recorded then)."""
    compiles: list[KernelCompile] = field(default_factory=list)
    available: bool = False
    _started: dict[Any, float] = field(default_factory=dict)
    _saved: tuple[Any, Any] | None = None

    def __enter__(self) -> TritonCompiles:
        try:
            from triton import knobs
        except ImportError:
            return self
        runtime = knobs.runtime
        self._saved = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = self._before, self._after
        self.available = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            from triton import knobs
            knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = self._saved
            self._saved = None

    # Keyword arguments only, read with defaults: the hooks' arguments differ between Triton versions,
    # and an exception here would fail the launch being compiled.
    def _before(self, **kw: Any) -> bool:
        self._started[str(kw.get("key"))] = time.perf_counter()
        return False  # a true answer would tell Triton to skip the compile

    def _after(self, **kw: Any) -> None:
        started = self._started.pop(str(kw.get("key")), time.perf_counter())
        fn = kw.get("fn")
        self.compiles.append(KernelCompile(str(getattr(fn, "name", fn)), str(kw.get("repr", "")),
                                           time.perf_counter() - started))

    def summary(self) -> dict[str, Any]:
        return {"available": self.available, "count": len(self.compiles),
                "total_s": sum(c.seconds for c in self.compiles),
                "kernels": [{"kernel": c.kernel, "seconds": round(c.seconds, 3), "signature": c.signature}
                            for c in self.compiles]}
