"""Shared fixtures: the engine on the default model, the Hugging Face reference, and a block
accounting check that runs after every test on every engine the test created."""
from __future__ import annotations

import fcntl
import json
import os
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

# Triton kernels (engine/gpu/) run on the CPU through Triton's interpreter where no GPU is: the flag
# must be set before any kernel is decorated, that is before raypd.engine.gpu is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# KV pools on plain pages (engine/cache/host_memory.py): on this project's VMs a huge page's first
# touch costs ~8 s of kernel time per GiB, paid by every engine and node the suite starts (hundreds),
# and no test here measures the transfer speed huge pages are for. tests/engine/test_host_memory.py
# turns them on for its own tests. Set before Ray or any server starts, so their processes inherit it.
os.environ.setdefault("RAYPD_KV_HUGE_PAGES", "0")

from tests.prompts import all_prompt_ids  # noqa: E402
from tests.run_suite import RUN_DIR_VARIABLE  # noqa: E402

# 32 greedy tokens: the five reference continuations that end at EOS end within 30, so every prompt still
# ends the way it did at 48 ("stop" or "length"), at two thirds of the decode steps of every parity test.
NEW_TOKENS = 32


@pytest.fixture(scope="session", autouse=True)
def interpreter_loop_bounds():
    """Triton 3.6's interpreter turns a tensor loop bound into a Python int with int() of a shape-(1,)
    array, which numpy >= 2.4 refuses (triton-lang/triton#9171): apply the upstream fix (squeeze first)
    for the run, and only where the bug is. The kernels in engine/gpu/ loop to bounds read from tensors."""
    import numpy as np
    try:
        int(np.ones(1))
        broken = False
    except TypeError:
        broken = True
    if os.environ.get("TRITON_INTERPRET") != "1" or not broken:
        yield
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interpreter, "_patch_lang_tensor", patch_lang_tensor)
        yield


@pytest.fixture(scope="session", autouse=True)
def interpreter_device_calls_keep_the_launch_patch():
    """Triton 3.6's interpreter patches triton.language for a kernel launch and restores it after, but
    also patches it again, without restoring, at every call of a @triton.jit device function inside the
    kernel: about 1 ms per call, once per program instance, a quarter of the interpreted tests' time
    here. Inside a launch whose patch already covers the language modules the device function sees
    (the same module objects), the second patch changes nothing, so skip it. Outside a launch, and for
    the first call in a launch of a device function that sees a language module not yet patched in it
    (Triton's own tl.sum, tl.max, tl.cdiv see triton.language.core), Triton's own path runs."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import functools
    import inspect
    import threading

    import triton.language as tl
    from triton.runtime import interpreter

    original_patch, original_launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    state = threading.local()  # per thread: .launch_langs, the language modules the current launch patched

    class Unpatched:
        def restore(self) -> None:
            pass

    @functools.cache  # a walk over the module's globals, per call otherwise; its imports do not change
    def langs_of(fn) -> frozenset:
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def patch_lang(fn):
        covered = getattr(state, "launch_langs", None)
        langs = langs_of(fn)
        if covered is not None and langs <= covered:
            return Unpatched()
        scope = original_patch(fn)
        if getattr(state, "in_launch", False):
            # The launch's own patch, or a device function's (tl.sum, tl.cdiv: triton.language.core
            # in their globals, where the kernel sees only triton.language), which Triton never
            # restores: either way what it patched stays patched to the launch's end.
            state.launch_langs = langs if covered is None else covered | langs
        return scope

    def launch(self, *args, **kwargs):
        outer = getattr(state, "in_launch", False), getattr(state, "launch_langs", None)
        state.in_launch, state.launch_langs = True, None
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            state.in_launch, state.launch_langs = outer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(interpreter, "_patch_lang", patch_lang)
        mp.setattr(interpreter.GridExecutor, "__call__", launch)
        yield


_live_engines: weakref.WeakSet = weakref.WeakSet()


@pytest.fixture(scope="session")
def make_llm():
    """Build an LLM with engine options; every engine made here is checked after each test."""
    from raypd.engine import LLM

    cache: OrderedDict[tuple, LLM] = OrderedDict()

    def make(**options):
        # A smaller KV pool than the 1 GiB default, and only the few most recent engines kept: the
        # suite builds dozens of configurations, and later tests start Ray clusters that need memory.
        if "num_blocks" not in options:
            options.setdefault("kv_cache_memory_mb", 256)
        key = tuple(sorted(options.items()))
        if key not in cache:
            while len(cache) >= 4:
                cache.popitem(last=False)
            cache[key] = LLM(**options)
            _live_engines.add(cache[key].engine)
        cache.move_to_end(key)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random Llama with the default tokenizer (tests/tiny_model.py), for the tests about
    serving, failures and accounting rather than about the real model's tokens."""
    from tests.tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def llm(make_llm):
    return make_llm()


@pytest.fixture(scope="session")
def tokenizer():
    """The default model's tokenizer alone, for the tests that tokenize without an engine (the Ray
    tests' driver, the ingress app's tests) and for the prompts every parity test sends."""
    from raypd.engine.model.source import resolve_model
    from raypd.engine.tokenizer import Tokenizer

    return Tokenizer(resolve_model(None))


@pytest.fixture(scope="session")
def prompt_ids(tokenizer) -> list[list[int]]:
    ids = all_prompt_ids(tokenizer)
    assert len(ids) >= 10 and min(map(len, ids)) < 10 and max(map(len, ids)) > 300
    return ids


def hf_greedy(prompt_ids: list[list[int]], dtype_name: str, model_dir: str | None = None,
              new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy continuations (up to `new_tokens`) from transformers in `dtype_name`, one prompt at a
    time (no padding), stopping at EOS like the engine: of the default model (its GGUF, with
    transformers' own dequantizer), or of the Hugging Face folder `model_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    from raypd.engine.model.source import default_model_path

    dtype = getattr(torch, dtype_name)
    if model_dir is None:
        path = default_model_path()
        with gguf_parsed_once():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.eval()
    out = []
    with torch.inference_mode():
        for ids in prompt_ids:
            gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=new_tokens, do_sample=False)
            out.append(gen[0, len(ids):].tolist())
    return out


@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """While transformers loads a GGUF: its file parsed once, not once for the config and again for
    the weights, and gguf's tensor name map built once, not once per tensor (397 times). Neither
    changes what is loaded (both are only read); together they took 11 of the 16 s a load takes here."""
    import functools

    import gguf

    name_map, reader = gguf.get_tensor_name_map, gguf.GGUFReader

    @functools.cache
    def parsed(path: str, mode: str = "r"):
        return reader(path, mode)

    gguf.get_tensor_name_map = functools.cache(name_map)
    gguf.GGUFReader = lambda path, mode="r": parsed(str(path), mode)
    try:
        yield
    finally:
        gguf.get_tensor_name_map, gguf.GGUFReader = name_map, reader


def once_per_run(tmp_path_factory, name: str, compute: Callable[[], list]) -> list:
    """compute() once for the whole run: the first process to ask computes it while the others wait on
    a lock and then read its JSON from the run's shared folder (RAYPD_TEST_RUN_DIR, where `make test`
    sets it; else, under pytest-xdist, the workers' common temporary folder)."""
    if os.environ.get(RUN_DIR_VARIABLE):
        shared = Path(os.environ[RUN_DIR_VARIABLE])
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent  # the workers' folders are popen-gw0, popen-gw1, ...
    else:
        return compute()
    result = shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            result.write_text(json.dumps(compute()))
        return json.loads(result.read_text())


@pytest.fixture(scope="session")
def hf_reference(prompt_ids, tmp_path_factory) -> list[list[int]]:
    """The float32 reference every parity test compares against (transformers takes ~40 s here)."""
    return once_per_run(tmp_path_factory, "hf-reference-float32", lambda: hf_greedy(prompt_ids, "float32"))


@pytest.fixture(scope="session")
def tiny_reference(tiny_model_dir, prompt_ids, tmp_path_factory) -> list[list[int]]:
    """transformers' float32 greedy continuations on the tiny model (a few seconds), for the cluster
    tests whose question is what the nodes and the transfer do to the tokens, whatever the weights.
    Once per run: every worker's tiny model is built from the same seed."""
    return once_per_run(tmp_path_factory, "tiny-reference-float32",
                        lambda: hf_greedy(prompt_ids, "float32", tiny_model_dir))


PROCESS_MARK = "RAYPD_TEST_PROCESS_MARK"


@pytest.fixture
def own_processes(monkeypatch) -> Callable[..., list]:
    """For a test that asserts it leaves no process behind while other tests run beside it: every
    process started from here on (Ray's daemons and workers, servers, what they start in turn) inherits
    a mark in its environment, which it keeps when re-parented. The returned function lists the marked
    processes still running whose command line holds one of the given words."""
    import secrets

    import psutil

    mark = f"{os.getpid()}-{secrets.token_hex(8)}"
    monkeypatch.setenv(PROCESS_MARK, mark)

    def left(*words: str) -> list:
        found = []
        for p in psutil.process_iter(["cmdline", "environ", "status"]):
            if (p.info["environ"] or {}).get(PROCESS_MARK) != mark or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(p.info["cmdline"] or [])
            if any(w in cmdline for w in words):
                found.append((p.pid, cmdline[:120]))
        return found

    return left


@pytest.fixture(autouse=True)
def block_accounting_adds_up():
    yield
    for eng in list(_live_engines):
        eng.check_block_integrity()
        assert not eng.requests, f"requests left in the engine: {list(eng.requests)}"
        acc = eng.block_accounting()
        assert not eng.reservations, f"reservations left: {list(eng.reservations)}"
        assert acc.held == 0 and acc.free + acc.cached == acc.total, acc


def keyed(url: str) -> str:
    """`url` as a keyed address (kvtransfer/identity.py): whoever listens there, if anyone, has this
    process's shared key. For addresses where nobody listens, or where this process does."""
    from raypd.kvtransfer.data_plane_auth import process_identity

    return process_identity().address(url)


@pytest.fixture(scope="module")
def sink():
    """The caller's end of the token streams (tests/node/pd.py's TokenSink: a PULL socket whose
    address goes in NodeRequest.reply_address), one per test module."""
    from tests.node.pd import TokenSink

    s = TokenSink()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def one_process_tests_start_no_ray(request):
    """`pytest -m "not cluster"` is the fast one-process tier: a test that starts Ray must say so."""
    yield
    if request.node.get_closest_marker("cluster") is None:
        ray = sys.modules.get("ray")
        assert ray is None or not ray.is_initialized(), \
            f"{request.node.nodeid} started Ray: mark its module with pytestmark = pytest.mark.cluster"


# Files that start processes but no Ray cluster of the "ray" group's size: transfer peers, benchmarks,
# a pytest per CPU path, `raypd generate` in one process, Ray without nodes or with one small node,
# a Conductor alone, one small real-model cluster whose test checks only the processes it started
# (own_processes). Each is a group of its own, beside the one-process tests and the "ray" group.
OWN_GROUP = {"tests/kvtransfer/test_two_process.py", "tests/kvtransfer/test_nixl_completion.py",
             "tests/kvtransfer/test_transport_report.py",
             "tests/kvtransfer/test_bench_smoke.py", "tests/kvtransfer/test_broken_endpoint_lab.py",
             "tests/engine/test_cpu_paths.py", "tests/engine/test_bench_smoke.py",
             "tests/engine/test_cli.py", "tests/cluster/test_ray_init.py", "tests/conductor/test_actor.py",
             "tests/cluster/test_gpu_placement.py", "tests/cluster/test_gpu_smoke.py",
             "tests/bench_serve/test_two_systems.py"}


# Files whose Ray clusters or servers run the tiny model with small KV pools (a few hundred MB each;
# the labs' clusters live in network namespaces of their own, under names and bridges each lab draws):
# each is a group of its own, like the one-process files, so the workers share them out instead of
# queueing them behind one another.
RAY_TINY = {"tests/bench_chaos/test_chaos_short.py", "tests/bench_chaos/test_chaos_lab.py",
            "tests/bench_soak/test_soak_short.py",
            "tests/bench_tenants/test_tenants_short.py", "tests/pool_scaling/test_autoscale_serve.py",
            "tests/bench_autoscale/test_autoscale_short.py",
            "tests/lab/test_lab.py", "tests/lab/test_pd_across_racks.py",
            "tests/lab/test_host_faults.py", "tests/bench_links/test_links_lab.py",
            "tests/lab/test_ray_up_local.py",
            "tests/cluster/test_fault_tolerance.py", "tests/cluster/test_pd_failures.py",
            "tests/cluster/test_pd_parity.py", "tests/cluster/test_pd_cli.py",
            "tests/cluster/test_prefix_copy.py", "tests/cluster/test_flex_duties.py",
            "tests/cluster/test_local_prefill.py", "tests/cluster/test_placement.py"}


# One-process tests that only compute in the test's own process: no thread, process, socket or
# wall-clock bound of their own, so nothing in them can time out when they get little CPU. They carry
# the `compute` mark, and `make test` runs them at the lowest CPU priority beside the rest
# (tests/run_suite.py), in the cycles the cluster tests leave idle. tests/test_suite_tiers.py checks
# that these files import nothing that runs beside the test or waits on the clock.
COMPUTE_DIR = "tests/engine/"
NOT_COMPUTE = {"tests/engine/test_tokenizer.py",       # a subprocess, with a timeout
               "tests/engine/test_model_families.py"}  # prefill and decode nodes: threads, transfer timeouts


def compute_only(path: str) -> bool:
    return path.startswith(COMPUTE_DIR) and path not in NOT_COMPUTE


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marker into the node id's group
def pytest_collection_modifyitems(config, items) -> None:
    """`make test` (tests/run_suite.py) runs the suite on pytest-xdist workers (--dist loadgroup), and
    a group runs on one worker. Every test that starts Ray or a server on the default model is in one
    group, "ray": two such Ray clusters at once would not fit this machine's memory (Ray's OOM killer
    took a node pool when they shared it). The tiny model's clusters (RAY_TINY) and the small set-ups
    of OWN_GROUP are small enough to be the exceptions: each of those files, and each other file, is a
    group of its own. Within a group, module- and package-scoped clusters are shared as without xdist.
    The compute-only tests get the `compute` mark here (COMPUTE_DIR), which `make test` runs apart.

    xdist hands groups out in the order collected (`make test` turns off its reordering by test
    count), so the run's end is whatever long group started last: the "ray" group goes first, then
    every other file that starts processes (most take 20-90 s), then the one-process files (most take
    seconds), which fill the workers to the end. Within a file the order stays the file's own."""
    rank = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        cluster = item.get_closest_marker("cluster") is not None
        if not cluster and compute_only(path):
            item.add_marker(pytest.mark.compute)
        shared = cluster and path not in OWN_GROUP | RAY_TINY
        item.add_marker(pytest.mark.xdist_group("ray" if shared else path))
        rank[item.nodeid] = 0 if shared else 1 if cluster else 2
    items.sort(key=lambda item: rank[item.nodeid])  # stable: the collected order within each rank


@pytest.fixture(scope="session", autouse=True)
def one_thread_per_xdist_worker():
    """Two workers on a 2-core machine: each engine's torch gets one thread, not both cores (threads
    beyond the cores only spin against each other; tests that name a thread count still get it)."""
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
    yield


def pytest_report_header(config) -> list[str]:
    """The CPU the suite runs on and the kernel path it takes (tests/engine/test_cpu_paths.py runs
    the kernel tests once more on each lower path this CPU can run)."""
    import torch

    from raypd.engine.model import cpu_paths

    return [cpu_paths.describe(), f"ATen CPU capability: {torch.backends.cpu.get_cpu_capability()}"]


def pytest_terminal_summary(terminalreporter) -> None:
    """Which CPU kernel paths this run exercised, and which this CPU could not run."""
    from tests.engine.test_cpu_paths import PATH_TEST, summarize

    reports = [r for outcome in ("passed", "failed", "skipped") for r in terminalreporter.stats.get(outcome, [])
               if PATH_TEST in getattr(r, "nodeid", "")]
    if reports:
        terminalreporter.write_sep("-", "CPU kernel paths")
        for line in summarize(reports):
            terminalreporter.write_line(line)
