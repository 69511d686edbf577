"""Streaming tokens from a decode node to its caller: Ray streaming generators vs pyzmq PUSH/PULL.

Set-up, all on one host: a Ray async actor stands in for a decode node. On its own thread a fake
engine emits one token per stream per step for S streams, N steps, one step every --step-ms (0: as
fast as it can; the thread sleeps, so it does not take a core the way a real decode step would). The
caller is this process (the Ray driver, an asyncio loop like a Serve ingress): one coroutine per
stream, each timestamping the tokens it receives. Every path sends one request per stream to the
actor with a Ray call, as a real ingress would, and every path coalesces what queued up meanwhile:
- ray: the nodes' first design (a StreamHub in node/streams.py, replaced by zmq after this
  benchmark). The engine thread pushes (token, t) into an asyncio.Queue per stream with
  loop.call_soon_threadsafe; the stream's async generator method yields everything queued since its
  last yield as one item; the caller does
  `async for ref in actor.ray_stream.remote(...): item = await ref`. Items are plain tuples (a
  class defined in __main__ would be pickled by value with every item).
- zmq (what node/streams.py and cluster/token_receiver.py do now): per step, one msgpack message
  per destination socket carrying every stream bound there ([t, request ids, tokens]; here one
  caller, so one message per step), sent by the engine thread on a PUSH socket connected to the
  caller's PULL socket (tcp on 127.0.0.1). A dispatcher coroutine in the caller decodes and routes
  tokens to per-stream asyncio.Queues, drained the same way.
- zmq-stream: zmq with one message per stream per step: as many messages as ray, so ray vs
  zmq-stream compares the cost of a message.
- ray-mux: one Ray streaming generator per caller for all its streams, one call_soon_threadsafe per
  step, items of [t, request ids, tokens] steps routed like zmq: as many messages as zmq.

Per run (medians of --reps runs, paths interleaved):
- latency: produced (time.time() on the engine thread right after the step) -> received by the
  stream's coroutine (time.time()); p50 and p99 over all S x N tokens.
- CPU per token, net of idle (each process's idle rate, the quieter of a window before and one after
  the runs, times the run's wall time):
  the caller (getrusage of this process: asyncio loop and Ray core-worker threads), the actor
  (getrusage inside it: event loop, engine thread, Ray or zmq threads), and the rest of Ray (raylet,
  gcs_server and other workers started by ray.init, from /proc/PID/task/*/schedstat).
- msgs: transport messages per run (Ray items yielded, or zmq messages); tok/s: S x N / (last token
  received - first step). At step 0 the engine outruns either path and coalescing packs many tokens
  per message, so tok/s is the path's ceiling under this design, not a per-message rate.

    python benchmarks/streaming_overhead.py --streams 32 --tokens 64 --step-ms 0,30 --json bench-results/streaming_overhead.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import cast

import msgpack
import numpy as np
import ray
import zmq
import zmq.asyncio
from ray.actor import ActorHandle

PATHS = ("ray", "ray-mux", "zmq", "zmq-stream")
MUX = -1  # the key of a run's multiplexed sink among its streams
# A run is the plain tuple (run_id, streams, tokens, step_s, path): a class defined here would be
# pickled by value with every call.


def own_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def coalesced(q: asyncio.Queue, count: int):
    """Yield lists of everything queued since the last yield, until `count` entries came through."""
    while count:
        batch = [await q.get()]
        while not q.empty():
            batch.append(q.get_nowait())
        count -= len(batch)
        yield batch


# -- the decode node stand-in ---------------------------------------------------------------------
class TokenSource:
    """Runs one fake engine thread per run, once all of the run's streams have joined (a Ray actor
    with one CPU: bench() starts it)."""

    def __init__(self) -> None:
        self._joining: dict[int, dict[int, object]] = {}
        self._zmq = zmq.Context()
        self._push: dict[str, zmq.Socket] = {}  # one per caller address, only used by engine threads

    def cpu(self) -> tuple[int, float]:
        return os.getpid(), own_cpu_s()

    def _join(self, run: tuple, stream: int, sink) -> None:
        run_id, streams, path = run[0], run[1], run[4]
        joined = self._joining.setdefault(run_id, {})
        joined[stream] = sink
        if len(joined) == streams + (path == "ray-mux"):
            del self._joining[run_id]
            threading.Thread(target=self._engine, args=(run, joined), daemon=True).start()

    async def ray_stream(self, run: tuple, stream: int):
        """Ray streaming generator: ([token ids], [produced times]) per item, coalesced."""
        q: asyncio.Queue = asyncio.Queue()
        self._join(run, stream, (asyncio.get_running_loop(), q))
        async for batch in coalesced(q, run[2]):
            yield [tok for tok, _ in batch], [t for _, t in batch]

    async def ray_mux(self, run: tuple):
        """Ray streaming generator for every stream of the run: a list of [t, request ids, tokens] steps per item."""
        q: asyncio.Queue = asyncio.Queue()
        self._join(run, MUX, (asyncio.get_running_loop(), q))
        async for batch in coalesced(q, run[2]):
            yield batch

    async def mux_join(self, run: tuple, stream: int) -> None:
        self._join(run, stream, None)

    async def zmq_stream(self, run: tuple, stream: int, address: str) -> None:
        sock = self._push.get(address)
        if sock is None:
            sock = self._push[address] = self._zmq.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
        self._join(run, stream, sock)

    def _engine(self, run: tuple, sinks: dict) -> None:
        run_id, _, tokens, step_s, path = run
        ids = {s: f"r{run_id}-{s}" for s in sinks if s != MUX}
        all_ids = list(ids.values())
        by_socket: dict[zmq.Socket, list[int]] = defaultdict(list)
        if path == "zmq":
            for s, sock in sinks.items():
                by_socket[sock].append(s)
        start = time.time()
        for k in range(tokens):
            time.sleep(max(start + k * step_s - time.time(), 0.0))
            t = time.time()  # the step's tokens exist now
            if path == "ray":
                for loop, q in sinks.values():
                    loop.call_soon_threadsafe(q.put_nowait, (k, t))
            elif path == "ray-mux":
                loop, q = sinks[MUX]
                loop.call_soon_threadsafe(q.put_nowait, [t, all_ids, [k] * len(all_ids)])
            elif path == "zmq":
                for sock, streams in by_socket.items():
                    sock.send(msgpack.packb([t, [ids[s] for s in streams], [k] * len(streams)]))
            else:
                for s, sock in sinks.items():
                    sock.send(msgpack.packb([t, [ids[s]], [k]]))


# -- the caller -----------------------------------------------------------------------------------
class Receipts:
    def __init__(self) -> None:
        self.latency: list[float] = []
        self.first_produced = float("inf")
        self.last_received = 0.0
        self.msgs = 0

    def got(self, produced: list[float]) -> None:
        now = time.time()
        self.latency.extend(now - t for t in produced)
        self.first_produced = min(self.first_produced, min(produced))
        self.last_received = max(self.last_received, now)


async def run_ray(actor, run: tuple, rec: Receipts) -> None:
    async def consume(stream: int) -> None:
        async for ref in actor.ray_stream.remote(run, stream):
            _, produced = await ref
            rec.msgs += 1
            rec.got(produced)

    await asyncio.gather(*(consume(s) for s in range(run[1])))


async def run_demuxed(actor, run: tuple, rec: Receipts, pull: zmq.asyncio.Socket, address: str) -> None:
    """ray-mux, zmq, zmq-stream: a dispatcher routes [t, request ids, tokens] steps to per-stream queues."""
    run_id, streams, tokens, _, path = run
    queues: dict[str, asyncio.Queue[tuple[int, float]]] = {f"r{run_id}-{s}": asyncio.Queue() for s in range(streams)}

    def route(t: float, ids: list[str], toks: list[int]) -> int:
        for rid, tok in zip(ids, toks):
            queues[rid].put_nowait((tok, t))
        return len(toks)

    async def dispatch() -> None:
        left = streams * tokens
        if path == "ray-mux":
            async for ref in actor.ray_mux.remote(run):
                rec.msgs += 1
                left -= sum(route(*step) for step in await ref)
        while left:
            rec.msgs += 1
            left -= route(*msgpack.unpackb(await pull.recv()))

    async def consume(q: asyncio.Queue) -> None:
        async for batch in coalesced(q, tokens):
            rec.got([t for _, t in batch])

    dispatcher = asyncio.create_task(dispatch())
    if path == "ray-mux":
        await asyncio.gather(*(actor.mux_join.remote(run, s) for s in range(streams)))
    else:
        await asyncio.gather(*(actor.zmq_stream.remote(run, s, address) for s in range(streams)))
    await asyncio.gather(dispatcher, *(consume(q) for q in queues.values()))


# -- process accounting ---------------------------------------------------------------------------
def proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time in ticks) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19])


def proc_cpu_s(pid: int) -> float:
    """CPU time of a process's live threads, in ns resolution (/proc/PID/stat counts 10 ms ticks)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:  # the thread just exited
            pass
    return total / 1e9


def machine_busy_idle_s() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine so far, from /proc/stat: others share this one."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:8]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK"), idle / os.sysconf("SC_CLK_TCK")


def descendants(root: int) -> dict[int, tuple[float, int]]:
    """pid -> (cpu seconds, start time) for every process below `root`."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := proc_stat(int(p)))}
    children = defaultdict(list)
    for pid, (ppid, _) in stats.items():
        children[ppid].append(pid)
    out, todo = {}, list(children[root])
    while todo:
        pid = todo.pop()
        out[pid] = (proc_cpu_s(pid), stats[pid][1])
        todo.extend(children[pid])
    return out


class Started:
    """The processes ray.init started (everything below this one), killed by pid if they outlive shutdown."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}

    def snapshot(self) -> dict[int, tuple[float, int]]:
        d = descendants(os.getpid())
        self.seen.update({pid: start for pid, (_, start) in d.items()})
        return d

    def kill_leftovers(self, grace_s: float = 5.0) -> list[int]:
        self.snapshot()
        deadline = time.time() + grace_s
        while True:
            alive = [p for p, start in self.seen.items() if (s := proc_stat(p)) and s[1] == start]
            if not alive or time.time() > deadline:
                break
            time.sleep(0.2)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return alive


class CpuMeter:
    """CPU seconds of the caller, the actor and the rest of Ray between two samples. Reading the
    actor's times and /proc costs the caller a little: time the caller tightly around the run instead."""

    def __init__(self, actor, started: Started):
        self.actor, self.started = actor, started

    async def sample(self) -> tuple[float, float, float, dict]:
        actor_pid, actor_s = await self.actor.cpu.remote()
        procs = self.started.snapshot()
        return time.time(), own_cpu_s(), actor_s, {p: c for p, (c, _) in procs.items() if p != actor_pid}

    @staticmethod
    def delta(a, b) -> dict:
        others = sum(c - a[3].get(p, 0.0) for p, c in b[3].items())
        return {"wall_s": b[0] - a[0], "caller_s": b[1] - a[1], "actor_s": b[2] - a[2], "ray_other_s": others}


# -- the benchmark --------------------------------------------------------------------------------
async def one_run(actor, meter: CpuMeter, run: tuple, pull, address: str, timeout_s: float) -> dict:
    streams, tokens, path = run[1], run[2], run[4]
    rec = Receipts()
    a = await meter.sample()
    go = run_ray(actor, run, rec) if path == "ray" else run_demuxed(actor, run, rec, pull, address)
    t0, caller_s = time.time(), own_cpu_s()
    await asyncio.wait_for(go, timeout_s)
    caller = {"caller_s": own_cpu_s() - caller_s, "caller_wall_s": time.time() - t0}
    cpu = {**CpuMeter.delta(a, await meter.sample()), **caller}
    n = streams * tokens
    if len(rec.latency) != n:
        raise RuntimeError(f"{path}: received {len(rec.latency)} tokens, expected {n}")
    lat = np.asarray(rec.latency)
    return {"tokens": n, "latency_p50_ms": float(np.percentile(lat, 50)) * 1e3,
            "latency_p99_ms": float(np.percentile(lat, 99)) * 1e3, "latency_max_ms": float(lat.max()) * 1e3,
            "msgs": rec.msgs, "tokens_per_msg": n / rec.msgs, "tok_s": n / (rec.last_received - rec.first_produced),
            **cpu}


def add_net_cpu(run: dict, idle: dict) -> None:
    """CPU per token net of what each process burns idle over the same wall time."""
    total = 0.0
    for who in ("caller", "actor", "ray_other"):
        wall = run["caller_wall_s"] if who == "caller" else run["wall_s"]
        net = run[f"{who}_s"] - idle[who] * wall
        run[f"{who}_us_per_tok"] = net / run["tokens"] * 1e6
        total += net
    run["cpu_cores"] = total / run["wall_s"]  # extra cores kept busy by streaming


async def idle_cores(meter: CpuMeter, seconds: float) -> dict:
    a = await meter.sample()
    await asyncio.sleep(seconds)
    d = CpuMeter.delta(a, await meter.sample())
    return {who: d[f"{who}_s"] / d["wall_s"] for who in ("caller", "actor", "ray_other")}


async def bench(args, started: Started, log=print) -> dict:
    # Ray types .remote() as "a handle or the class itself"; it is the handle.
    actor = cast(ActorHandle, ray.remote(TokenSource).options(num_cpus=1).remote())
    meter = CpuMeter(actor, started)
    ctx = zmq.asyncio.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    try:
        run_id = 0
        for path in args.paths:  # warm-up: worker start, code paths, the zmq connection
            for _ in range(2):
                run_id += 1
                await one_run(actor, meter, (run_id, args.streams, 8, 0.0, path), pull, address, args.timeout_s)
        idle_before = await idle_cores(meter, args.idle_s / 2)

        runs = []
        for step_ms in args.step_ms:
            for rep in range(args.reps):
                for path in args.paths:
                    run_id += 1
                    r = await one_run(actor, meter, (run_id, args.streams, args.tokens, step_ms / 1e3, path), pull,
                                      address, args.timeout_s)
                    runs.append({"path": path, "step_ms": step_ms, "rep": rep, **r})
                    log(f"{path:10s} step {step_ms:5.1f} ms rep {rep}: p50 {r['latency_p50_ms']:7.3f} ms"
                        f"  p99 {r['latency_p99_ms']:7.3f} ms  {r['msgs']:5d} msgs  {r['tok_s']:9.0f} tok/s")
        # Ray's own processes are still settling after start-up: the quieter of two windows is the idle rate.
        idle_after = await idle_cores(meter, args.idle_s / 2)
        idle = {who: min(idle_before[who], idle_after[who]) for who in idle_before}
        log("idle CPU (cores): " + ", ".join(f"{who} {v:.4f}" for who, v in idle.items()))
        for r in runs:
            add_net_cpu(r, idle)
        return {"idle_cores": idle, "idle_windows": [idle_before, idle_after], "runs": runs}
    finally:
        pull.close()
        ctx.term()
        ray.kill(actor)


def summarize(runs: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for r in runs:
        groups[r["path"], r["step_ms"]].append(r)
    out = []
    for (path, step_ms), rs in groups.items():
        row = {"path": path, "step_ms": step_ms, "reps": len(rs)}
        for k, v in rs[0].items():
            if k not in row and k != "rep" and isinstance(v, (int, float)):
                row[k] = statistics.median(r[k] for r in rs)
        out.append(row)
    return out


def table(summary: list[dict]) -> str:
    cols = [("path", "path", "{}"), ("step_ms", "step ms", "{:g}"), ("latency_p50_ms", "p50 ms", "{:.3f}"),
            ("latency_p99_ms", "p99 ms", "{:.3f}"), ("msgs", "msgs/run", "{:.0f}"),
            ("caller_us_per_tok", "caller us/tok", "{:.1f}"), ("actor_us_per_tok", "actor us/tok", "{:.1f}"),
            ("ray_other_us_per_tok", "ray-other us/tok", "{:.1f}"), ("cpu_cores", "cores", "{:.3f}"),
            ("tok_s", "tok/s", "{:.0f}")]
    rows = [[fmt.format(r[k]) for k, _, fmt in cols] for r in summary]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, (_, h, _) in enumerate(cols)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line([h for _, h, _ in cols]), *(line(row) for row in rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per stream (engine steps)")
    ap.add_argument("--step-ms", default="0,30", help="engine step periods, comma-separated")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {','.join(PATHS)}")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=4.0, help="idle CPU baseline, split before and after the runs")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="per run")
    ap.add_argument("--json", type=Path, help="write the full report here")
    args = ap.parse_args(argv)
    args.step_ms = [float(x) for x in args.step_ms.split(",")]
    args.paths = args.paths.split(",")
    if unknown := set(args.paths) - set(PATHS):
        ap.error(f"unknown paths {sorted(unknown)}")

    started = Started()
    t0, busy0 = time.time(), machine_busy_idle_s()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        # After ray.init, which installs a handler of its own that aborts: let the finally below run.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        result = asyncio.run(bench(args, started))
    finally:
        ray.shutdown()
        if killed := started.kill_leftovers():
            print(f"killed {len(killed)} leftover Ray processes: {killed}")

    report = {"command": " ".join(["python", "benchmarks/streaming_overhead.py", *(argv if argv is not None else sys.argv[1:])]),
              "config": {k: v for k, v in vars(args).items() if k != "json"},
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                          "ray": ray.__version__, "pyzmq": zmq.__version__, "loadavg": os.getloadavg()},
              "total_s": time.time() - t0, **result, "summary": summarize(result["runs"])}
    busy, idle = (b - a for a, b in zip(busy0, machine_busy_idle_s()))
    report["machine"]["busy_cores_during_run"] = (busy / (busy + idle)) * (os.cpu_count() or 1)
    print()
    print(table(report["summary"]))
    print(f"({args.streams} streams x {args.tokens} tokens, medians of {args.reps}; CPU net of idle; "
          f"total {report['total_s']:.0f} s; machine busy {report['machine']['busy_cores_during_run']:.2f} of "
          f"{os.cpu_count()} cores on average, everything included)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
