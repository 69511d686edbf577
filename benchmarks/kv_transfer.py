"""KV block transfer through kvtransfer: bandwidth and latency of each backend against an in-process torch
copy of the same bytes, measured in the same run; and the end-to-end handoff latency of one prompt's KV.

Set-up: the sender (prefill side) runs in this process, a receiver (decode side) in a spawned child, one
pair per backend, all on 127.0.0.1 (UCX limited to `lo`). Both pools hold max(sizes) blocks of
--block-bytes (default 737,280: one 16-token SmolLM2 block in float32), allocated like the engine's KV
pool (engine/host_memory.py: transparent huge pages where available), pages touched before timing.
For each backend, block count n and pattern, --reps fresh rooms, medians reported:
- contiguous: local blocks 0..n-1 -> remote 0..n-1 (one run); scattered: n random distinct ids on each
  side (almost no adjacent pairs, so about n descriptors).
- write_s: the write posted -> the bytes are at the peer (the sender's room record, t_landed - t_posted);
  bandwidth = bytes / write_s.
- room_s: the write posted -> the receiver's Done seen by the sender: what a caller waits.
- copy reference, in this process with 1 torch thread (CMA copies on one thread too): contiguous
  `dst[:n].copy_(pool[:n])`, scattered `torch.index_select(pool, 0, ids, out=dst[:n])`.
- raw CMA reference (Linux): the same block pattern written into the nixl receiver's pool with bare
  process_vm_writev calls, one iovec per run, no NIXL/UCX: the best any CMA transport can do here.
Handoff: a 256-token prompt's KV (16 blocks, scattered on both sides, aux slot included), timed inside
the receiver from add_room (destination registered) to the notification read (room SUCCESS). The
prompt's KV is ready, so the sender's send() is armed before the destination arrives and its loop posts
the write at once. Run for the nixl backend with NIXL's progress thread off (the default) and on, and tcp.

Targets (checked and printed with the numbers): nixl >= 70% of the copy bandwidth for transfers of
1 MiB and more; scattered < 2x contiguous at 256 blocks; handoff <= 2 x bytes / copy bandwidth + 1 ms.

Memory: about 3 x max(sizes) x block-bytes (8.6 GiB at 4096 blocks of 737,280 bytes).

    python benchmarks/kv_transfer.py --json bench-results/kv_transfer.json
    python benchmarks/kv_transfer.py --sizes 1,16 --reps 1 --handoff-reps 3      # a smoke run
"""
from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raypd.engine.cache import host_memory
from raypd.kvtransfer import KVReceiver, KVSender, TransferConfig
from raypd.kvtransfer import TransferState as S
from raypd.kvtransfer.data_plane_auth import DataPlaneSecret
from raypd.kvtransfer.descriptors import coalesce_runs

SMOLLM2_BLOCK_BYTES = 737_280
HANDOFF_BLOCKS = 16
AUX_SLOTS, AUX_BYTES = 64, 64


def bench_config(backend: str, secret: DataPlaneSecret, progress_thread: bool = False) -> TransferConfig:
    # Generous timeouts: a multi-GiB write on a loaded 2-core machine takes seconds.
    return TransferConfig(backend=backend, nixl_progress_thread=progress_thread,
                          bootstrap_timeout_s=60.0, transfer_timeout_s=300.0, heartbeat_interval_s=1.0,
                          heartbeat_timeout_s=60.0, identity=secret.shared_identity())


def make_pool(num_blocks: int, block_bytes: int, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Allocated as the engine allocates its KV pool (huge pages where the kernel offers them).
    pool = host_memory.zeros((num_blocks, block_bytes), torch.uint8)
    pool.fill_(fill)  # touches every page: no first-touch faults inside timings
    return pool, torch.full((AUX_SLOTS, AUX_BYTES), fill, dtype=torch.uint8)


# -- the receiver child ---------------------------------------------------------------------------
def receiver_main(conn, backend: str, secret: DataPlaneSecret, progress_thread: bool, num_blocks: int,
                  block_bytes: int) -> None:
    pool, aux = make_pool(num_blocks, block_bytes, 0)
    with KVReceiver(pool, aux, bench_config(backend, secret, progress_thread)) as rcv:
        conn.send(("ready", os.getpid(), pool.data_ptr()))  # pid and address: for the raw CMA reference
        while conn.poll(600):
            op, args = conn.recv()
            if op == "close":
                return
            room, address, dst, aux_slot = args
            rcv.add_room(room, address, dst, aux_slot)
            if op == "room":  # the parent drives the sender, then asks for the outcome
                conn.send("added")
                conn.poll(600)
                conn.recv()
            state = rcv.wait(room, S.SUCCESS, 600.0)
            rec = rcv.release(room)
            conn.send((int(state), rec.t_done - rec.t_added if rec.t_done else None))


class Receiver:
    def __init__(self, backend: str, secret: DataPlaneSecret, progress_thread: bool, num_blocks: int,
                 block_bytes: int):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=receiver_main,
                                args=(child, backend, secret, progress_thread, num_blocks, block_bytes), daemon=True)
        self.proc.start()
        child.close()
        ready, self.pid, self.pool_addr = self._expect(None, 300)
        if ready != "ready":
            raise RuntimeError(f"receiver child said {ready!r}, expected 'ready'")

    def _expect(self, what: str | None, timeout: float):
        if not self.conn.poll(timeout):
            raise TimeoutError(f"receiver child {self.proc.pid} silent for {timeout} s")
        got = self.conn.recv()
        if what is not None and got != what:
            raise RuntimeError(f"receiver child said {got!r}, expected {what!r}")
        return got

    def stop(self) -> None:
        try:
            self.conn.send(("close", None))
        except OSError:
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


# -- measurements ---------------------------------------------------------------------------------
def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ids_for(n: int, num_blocks: int, pattern: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if pattern == "contiguous":
        return np.arange(n), np.arange(n)
    return rng.choice(num_blocks, n, replace=False), rng.choice(num_blocks, n, replace=False)


def copy_reference(pool: torch.Tensor, n: int, pattern: str, reps: int, rng: np.random.Generator) -> float:
    dst = host_memory.zeros((n, pool.shape[1]), pool.dtype)
    dst.fill_(1)
    times = []
    for _ in range(reps + 1):  # the first round warms caches and is dropped
        ids = torch.from_numpy(ids_for(n, pool.shape[0], pattern, rng)[0])
        t0 = time.perf_counter()
        if pattern == "contiguous":
            dst.copy_(pool[:n])
        else:
            torch.index_select(pool, 0, ids, out=dst)
        times.append(time.perf_counter() - t0)
    return median(times[1:])


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _cma_calls(src_base: int, dst_base: int, block_bytes: int, runs, piece: int = 256 << 20):
    """Split runs into process_vm_writev calls: at most 1024 iovecs (IOV_MAX) and 1 GiB per call (the
    kernel stops near 2 GiB), each iovec at most `piece` bytes."""
    chunks = []
    for s, d, k in zip(runs.src_start.tolist(), runs.dst_start.tolist(), runs.length.tolist()):
        for off in range(0, k * block_bytes, piece):
            size = min(piece, k * block_bytes - off)
            chunks.append((src_base + s * block_bytes + off, dst_base + d * block_bytes + off, size))
    calls, i = [], 0
    while i < len(chunks):
        j, total = i, 0
        while j < len(chunks) and j - i < 1024 and total + chunks[j][2] <= 1 << 30:
            total += chunks[j][2]
            j += 1
        group = chunks[i:j]
        calls.append(((_IoVec * len(group))(*[_IoVec(a, n) for a, _, n in group]),
                      (_IoVec * len(group))(*[_IoVec(b, n) for _, b, n in group]), total))
        i = j
    return calls


def cma_reference(pool: torch.Tensor, rcv: Receiver, n: int, pattern: str, reps: int,
                  rng: np.random.Generator) -> float | None:
    """The same write as raw process_vm_writev calls (what UCX's CMA transport does underneath), one
    iovec per run of adjacent blocks: the best any CMA-based transport can do here. None off Linux."""
    if sys.platform != "linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_writev.restype = ctypes.c_ssize_t
    bb = pool.shape[1]
    times = []
    for _ in range(reps + 1):  # the first round is dropped, as for the copy
        runs = coalesce_runs(*ids_for(n, pool.shape[0], pattern, rng))
        calls = _cma_calls(pool.data_ptr(), rcv.pool_addr, bb, runs)
        t0 = time.perf_counter()
        for local, remote, want in calls:
            got = libc.process_vm_writev(rcv.pid, local, len(local), remote, len(remote), 0)
            if got != want:
                raise OSError(ctypes.get_errno(), f"process_vm_writev wrote {got} of {want} bytes")
        times.append(time.perf_counter() - t0)
    return median(times[1:])


def one_room(snd: KVSender, rcv: Receiver, room: int, src, dst, aux: int | None) -> dict:
    snd.add_room(room)
    rcv.conn.send(("room", (room, snd.bootstrap_address, dst.tolist(), aux)))
    rcv._expect("added", 60)
    if snd.wait(room, S.WAITING_FOR_INPUT, 120.0) != S.WAITING_FOR_INPUT:
        raise RuntimeError(f"room {room}: no destination: {snd.failure_reason(room)}")
    snd.send(room, src, aux)
    rcv.conn.send(("go", None))
    state, _ = rcv._expect(None, 600)
    if snd.wait(room, S.SUCCESS, 600.0) != S.SUCCESS or state != S.SUCCESS:
        raise RuntimeError(f"room {room} failed: {snd.failure_reason(room)}")
    rec = snd.release(room)
    assert rec.t_posted is not None and rec.t_landed is not None and rec.t_done is not None  # a SUCCESS room has all
    return {"write_s": rec.t_landed - rec.t_posted, "room_s": rec.t_done - rec.t_posted}


def handoff(snd: KVSender, rcv: Receiver, rooms: range, num_blocks: int, rng: np.random.Generator) -> list[float]:
    out = []
    for room in rooms:
        src, dst = ids_for(HANDOFF_BLOCKS, num_blocks, "scattered", rng)
        snd.add_room(room)
        snd.send(room, src, 0)  # the prompt's KV is ready: the write is armed for the destination
        rcv.conn.send(("handoff", (room, snd.bootstrap_address, dst.tolist(), room % AUX_SLOTS)))
        state, latency = rcv._expect(None, 600)
        snd.wait(room, S.SUCCESS, 600.0)
        snd.release(room)
        if state != S.SUCCESS:
            raise RuntimeError(f"handoff room {room} failed")
        out.append(latency)
    return out


def run_benchmark(sizes=(1, 16, 256, 4096), block_bytes: int = SMOLLM2_BLOCK_BYTES, reps: int = 5,
                  backends=("nixl", "tcp"), handoff_reps: int = 20, compare_progress_thread: bool = True,
                  copy_threads: int = 1, seed: int = 0, log=print) -> dict:
    """Run everything and return the report (what --json writes)."""
    torch.set_num_threads(copy_threads)
    rng = np.random.default_rng(seed)
    num_blocks = max(max(sizes), HANDOFF_BLOCKS)
    log(f"pools: {num_blocks} blocks x {block_bytes} B = {num_blocks * block_bytes / 2**30:.2f} GiB per process")
    pool, aux = make_pool(num_blocks, block_bytes, 7)
    report: dict[str, Any] = {"config": {"sizes": list(sizes), "block_bytes": block_bytes, "reps": reps, "backends": list(backends),
                         "handoff_reps": handoff_reps, "handoff_blocks": HANDOFF_BLOCKS, "copy_threads": copy_threads,
                         "seed": seed},
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                          "loadavg": os.getloadavg()},
              "copy": [], "cma": [], "transfers": [], "handoff": {}}

    copy_s, cma_s = {}, {}
    for n in sizes:
        for pattern in ("contiguous", "scattered"):
            t = copy_reference(pool, n, pattern, max(reps, 3), rng)
            copy_s[n, pattern] = t
            report["copy"].append({"blocks": n, "pattern": pattern, "bytes": n * block_bytes, "copy_s": t,
                                   "gbps": n * block_bytes / t / 1e9})
            log(f"copy   {pattern:10s} {n:5d} blocks {n * block_bytes / 2**20:9.2f} MiB  {t * 1e3:9.3f} ms"
                f"  {n * block_bytes / t / 1e9:6.2f} GB/s")

    variants = [(b, False) for b in backends] + ([("nixl", True)] if compare_progress_thread and "nixl" in backends else [])
    room = 1
    for backend, pthread in variants:
        label = backend + ("+progress_thread" if pthread else "")
        secret = DataPlaneSecret.generate()  # the two processes' deployment secret
        rcv = Receiver(backend, secret, pthread, num_blocks, block_bytes)
        try:
            with KVSender(pool, aux, bench_config(backend, secret, pthread)) as snd:
                # UCX finishes wiring a new peer up during the first few writes (they can take ms): keep
                # those out of the timings.
                for _ in range(8):
                    one_room(snd, rcv, room, np.arange(1), np.arange(1), 0)
                    room += 1
                if backend == "nixl" and not pthread:
                    for n in sizes:
                        for pattern in ("contiguous", "scattered"):
                            cma_t = cma_reference(pool, rcv, n, pattern, max(reps, 3), rng)
                            if cma_t is None:
                                continue
                            cma_s[n, pattern] = cma_t
                            report["cma"].append({"blocks": n, "pattern": pattern, "bytes": n * block_bytes,
                                                  "cma_s": cma_t, "gbps": n * block_bytes / cma_t / 1e9,
                                                  "vs_copy_contiguous": copy_s[n, "contiguous"] / cma_t})
                            log(f"cma    {pattern:10s} {n:5d} blocks {n * block_bytes / 2**20:9.2f} MiB  "
                                f"{cma_t * 1e3:9.3f} ms  {n * block_bytes / cma_t / 1e9:6.2f} GB/s "
                                f"({copy_s[n, 'contiguous'] / cma_t:.0%} of copy)"
                                "  raw process_vm_writev, no NIXL")
                if not pthread:
                    for n in sizes:
                        for pattern in ("contiguous", "scattered"):
                            res = []
                            for _ in range(reps):
                                src, dst = ids_for(n, num_blocks, pattern, rng)
                                res.append(one_room(snd, rcv, room, src, dst, 0))
                                room += 1
                            w, r = median([x["write_s"] for x in res]), median([x["room_s"] for x in res])
                            nbytes = n * block_bytes
                            row = {"backend": label, "blocks": n, "pattern": pattern, "bytes": nbytes,
                                   "runs": len(coalesce_runs(*ids_for(n, num_blocks, pattern, rng))),
                                   "write_s": w, "room_s": r, "gbps": nbytes / w / 1e9,
                                   "vs_copy_same_pattern": copy_s[n, pattern] / w,
                                   "vs_copy_contiguous": copy_s[n, "contiguous"] / w,
                                   "vs_raw_cma_same_pattern": cma_s[n, pattern] / w if (n, pattern) in cma_s else None}
                            report["transfers"].append(row)
                            log(f"{label:5s} {pattern:10s} {n:5d} blocks {nbytes / 2**20:9.2f} MiB  write {w * 1e3:9.3f} ms"
                                f"  {row['gbps']:6.2f} GB/s ({row['vs_copy_contiguous']:.0%} of copy)"
                                f"  room {r * 1e3:9.3f} ms")
                lat = handoff(snd, rcv, range(room, room + handoff_reps), num_blocks, rng)
                room += handoff_reps
                report["handoff"][label] = {"median_s": median(lat), "p90_s": float(np.percentile(lat, 90)),
                                            "min_s": min(lat), "samples_s": lat}
                log(f"{label:5s} handoff 16 x {block_bytes} B: median {median(lat) * 1e3:.3f} ms,"
                    f" p90 {np.percentile(lat, 90) * 1e3:.3f} ms, min {min(lat) * 1e3:.3f} ms")
        finally:
            rcv.stop()

    report["targets"] = check_targets(report, block_bytes, copy_s)
    for t in report["targets"]:
        log(f"target {'MET ' if t['met'] else 'MISS'} {t['name']}: {t['detail']}")
    return report


def check_targets(report: dict, block_bytes: int, copy_s: dict) -> list[dict]:
    out = []
    for row in report["transfers"]:
        if row["backend"] == "nixl" and row["bytes"] >= 1 << 20:
            out.append({"name": f"nixl >= 70% of copy bandwidth ({row['pattern']}, {row['blocks']} blocks)",
                        "met": row["vs_copy_contiguous"] >= 0.7,
                        "detail": f"nixl {row['gbps']:.2f} GB/s vs copy "
                                  f"{row['bytes'] / copy_s[row['blocks'], 'contiguous'] / 1e9:.2f} GB/s"
                                  f" = {row['vs_copy_contiguous']:.0%}"
                                  + (f"; nixl runs at {row['vs_raw_cma_same_pattern']:.0%} of raw CMA on the same blocks"
                                     if row.get("vs_raw_cma_same_pattern") else "")})
    by = {(r["backend"], r["blocks"], r["pattern"]): r for r in report["transfers"]}
    for backend in {r["backend"] for r in report["transfers"]}:
        c, s = by.get((backend, 256, "contiguous")), by.get((backend, 256, "scattered"))
        if c and s:
            out.append({"name": f"{backend}: scattered < 2x contiguous at 256 blocks", "met": s["write_s"] < 2 * c["write_s"],
                        "detail": f"scattered {s['write_s'] * 1e3:.2f} ms ({s['runs']} runs) vs contiguous"
                                  f" {c['write_s'] * 1e3:.2f} ms = {s['write_s'] / c['write_s']:.2f}x"})
    nbytes = HANDOFF_BLOCKS * block_bytes
    if (HANDOFF_BLOCKS, "contiguous") in copy_s:
        budget = 2 * copy_s[HANDOFF_BLOCKS, "contiguous"] + 1e-3
        for label, h in report["handoff"].items():
            out.append({"name": f"{label}: handoff <= 2 x bytes/copy bandwidth + 1 ms", "met": h["median_s"] <= budget,
                        "detail": f"median {h['median_s'] * 1e3:.3f} ms vs budget {budget * 1e3:.3f} ms"
                                  f" ({nbytes} B; copy {copy_s[HANDOFF_BLOCKS, 'contiguous'] * 1e3:.3f} ms)"})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,16,256,4096", help="block counts, comma-separated")
    ap.add_argument("--block-bytes", type=int, default=SMOLLM2_BLOCK_BYTES)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--backends", default="nixl,tcp")
    ap.add_argument("--handoff-reps", type=int, default=20)
    ap.add_argument("--no-progress-thread-compare", action="store_true",
                    help="skip the nixl handoff with NIXL's progress thread on")
    ap.add_argument("--copy-threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the full report here")
    args = ap.parse_args(argv)
    report = run_benchmark(sizes=tuple(int(x) for x in args.sizes.split(",")), block_bytes=args.block_bytes,
                           reps=args.reps, backends=tuple(args.backends.split(",")), handoff_reps=args.handoff_reps,
                           compare_progress_thread=not args.no_progress_thread_compare,
                           copy_threads=args.copy_threads, seed=args.seed)
    report["command"] = " ".join(["python", "benchmarks/kv_transfer.py", *(argv if argv is not None else sys.argv[1:])])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
