"""The systems `--systems` starts, one at a time, each on this machine with the same CPU budget.

    raypd-pd      raypd serve: 1 prefill + 1 decode node, cost routing
    raypd-pd-rr   the same with the round_robin policy
    raypd-mixed   raypd serve --mixed-nodes 2: two colocated nodes (the replica-fleet baseline)
    raypd-adaptive  raypd-pd with --adaptive: flex nodes whose duty the Conductor moves, and split
                  or local per request
    raypd-pd-tier raypd-pd with a KV disk tier (--kv-tier-dir): a fresh temporary folder per launch,
                  removed when the system stops, also when it fails to start
    llamacpp      llama.cpp's llama-server on the GGUF raypd serves by default, one slot per
                  concurrent request, prompt caching on (`cache_prompt` in every request)
    llamacpp-t1   the same with one thread: on a busy shared machine llama.cpp's threads wait for
                  each other at every op's barrier, and one thread can beat two

Every raypd node gets `cpus` CPUs (its torch threads); llama-server gets `-t` = 2 x that. A raypd
system's log names its Ray cluster, where tier/node_stats.py reads the nodes' KV tier totals.

raypd-pd against raypd-pd-tier (main.py's tier command): SmolLM2-135M keeps 2 (K, V) x 30 layers
x 3 KV heads x 64 dims x 4 bytes (float32) = 46,080 bytes of KV per token, 720 KiB per 16-token
block. A conversation of a 768-token system prompt, 64-token user turns and 16-token answers sends
1,119 prompt tokens at its 4th turn (chat template included), 70 blocks; 8 such are 8 x 1,119 x
46,080 B = 393 MiB, so `--kv-cache-memory 400` (568 blocks per node) holds 8, and 32 conversations
(2,240 blocks) need 4 pools. With `--max-concurrency 4` and every session starting at once, a
conversation's next turn comes after the 31 others have had theirs: without the tier its history is
recomputed (32 x 3,930 = 126k prompt tokens in all), with it only the new turn is (about 37k). At
the 260-300 prompt tokens/s a prefill node managed in the small trial on this 2-core machine, the
two runs take about 8-10 minutes; a closed loop's default deadline is 60 s, hence --run-deadline.

A system runs as a subprocess in its own session (process group). Lifecycle:
    start -> wait until GET /v1/models answers (the log shows why if it exits first)
          -> (measure) -> stop: SIGTERM to the system's own process, wait, SIGKILL to the group and
          to every descendant seen while it ran (Ray's workers leave the group's tree), then check
          by pid that none is left.
SIGTERM goes to the leader only: `raypd serve` stops Serve and then the Ray daemons it started. A
SIGTERM to the whole group killed Ray's GCS and raylet first, and Serve's shutdown then waited out
its 30 s for a controller that could no longer reach them.
"""
from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from raypd.benchmarks.serve.ports import free_port

RAYPD_SYSTEMS = {"raypd-pd": ["--prefill-nodes", "1", "--decode-nodes", "1", "--policy", "cost"],
                 "raypd-pd-rr": ["--prefill-nodes", "1", "--decode-nodes", "1", "--policy", "round_robin"],
                 "raypd-mixed": ["--mixed-nodes", "2"],
                 "raypd-adaptive": ["--prefill-nodes", "1", "--decode-nodes", "1", "--policy", "cost", "--adaptive"],
                 "raypd-pd-tier": ["--prefill-nodes", "1", "--decode-nodes", "1", "--policy", "cost"]}
KV_TIER_SYSTEMS = ("raypd-pd-tier",)  # started with --kv-tier-dir <a fresh temporary folder>
RAY_CLUSTER_LINE = re.compile(rb"raypd serve: Ray cluster: (\S+)")  # cluster/cli/serve.py logs it once up
LLAMACPP_SYSTEMS = ("llamacpp", "llamacpp-t1")
SYSTEMS = (*RAYPD_SYSTEMS, *LLAMACPP_SYSTEMS)


class LaunchError(RuntimeError):
    """A system did not start or did not stop cleanly; the message says which and why."""


@dataclass(frozen=True)
class LaunchOptions:
    cpus: float = 1.0                  # per raypd node; llama-server gets 2 x cpus threads
    slots: int = 16                    # llama-server parallel slots
    slot_context: int = 4096           # tokens per slot
    llama_server: Path | None = None   # the binary (llamacpp only)
    raypd_args: tuple[str, ...] = ()   # more `raypd serve` flags for every raypd system
    ready_timeout_s: float = 600.0


def command(name: str, port: int, opts: LaunchOptions, tier_dir: Path | None = None) -> list[str]:
    if name in RAYPD_SYSTEMS:
        tier = ["--kv-tier-dir", str(tier_dir)] if tier_dir is not None else []
        return [sys.executable, "-m", "raypd", "serve", "--port", str(port), "--no-dashboard",
                "--cpus-per-node", str(opts.cpus), *RAYPD_SYSTEMS[name], *tier, *opts.raypd_args]
    if name in LLAMACPP_SYSTEMS:
        if opts.llama_server is None:
            raise LaunchError("llamacpp needs the llama-server binary")
        from raypd.engine.model.source import default_model_path

        gguf = default_model_path()
        return [str(opts.llama_server), "-m", str(gguf), "--alias", gguf.stem, "--host", "127.0.0.1", "--port", str(port),
                "-t", "1" if name == "llamacpp-t1" else str(max(1, round(2 * opts.cpus))), "--parallel", str(opts.slots),
                "-c", str(opts.slots * opts.slot_context), "--no-webui"]
    raise LaunchError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}")


def extra_body(name: str) -> dict:
    """Fields a system needs in every request (raypd rejects unknown fields, so only llama.cpp's)."""
    return {"cache_prompt": True} if name in LLAMACPP_SYSTEMS else {}


@dataclass
class Launched:
    """One started system: its process, log and every process seen under it, and the scratch
    folder (a KV tier's) it was given, removed when it stops."""
    name: str
    cmd: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    scratch: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def ray_address(self, wait_s: float = 30.0) -> str | None:
        """The Ray cluster a raypd system started, as its log names it; None for other systems. The
        line can come a moment after /v1/models first answers: it is waited for while the system runs."""
        if self.name not in RAYPD_SYSTEMS:
            return None
        deadline = time.monotonic() + wait_s
        while not (m := RAY_CLUSTER_LINE.search(self.log_path.read_bytes())):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return None
            time.sleep(0.2)
        return m.group(1).decode()

    @classmethod
    def start(cls, name: str, cmd: list[str], port: int, log_path: Path, scratch: Path | None = None) -> Launched:
        log = open(log_path, "wb")
        env = {**os.environ, "RAYPD_API_KEY": ""}
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        finally:
            log.close()
        return cls(name, cmd, port, log_path, proc, scratch=scratch)

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def remember(self) -> None:
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.remember()
            if self.proc.poll() is not None:
                raise LaunchError(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=5) as r:
                    if r.status == 200:
                        self.remember()
                        return
            except http.client.HTTPException as e:  # something answers there, and not in HTTP
                raise LaunchError(f"port {self.port} answers but not with HTTP ({type(e).__name__}): another "
                                  f"process holds it\n{self.log_tail()}") from None
            except OSError:
                pass
            time.sleep(1.0)
        raise LaunchError(f"{self.name} not ready within {timeout_s:.0f}s:\n{self.log_tail()}")

    def stop(self, grace_s: float = 60.0) -> list[int]:
        """Stop everything it started; return the pids still alive afterwards (empty when clean)."""
        self.remember()
        try:
            self.proc.send_signal(signal.SIGTERM)  # the leader only: it stops what it started, in order
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 15
        while (left := self.alive()) and time.monotonic() < deadline:
            for p in left:  # Ray workers re-parented out of the group: by pid, as remembered
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.5)
        left = [p.pid for p in self.alive()]
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return left

    def alive(self) -> list[psutil.Process]:
        out = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:  # is_running checks the pid's start time
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # start_new_session: the group id is the child's pid
    except (ProcessLookupError, PermissionError):
        pass


def launch(name: str, opts: LaunchOptions, log_dir: Path) -> Launched:
    """Start `name` and wait until it answers; on any failure stop what was started, remove its
    scratch folder and raise."""
    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix=f"raypd-bench-{name}-")) if name in KV_TIER_SYSTEMS else None
    try:
        sysm = Launched.start(name, command(name, port, opts, scratch), port, log_dir / f"{name}.log", scratch)
    except BaseException:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    try:
        sysm.wait_ready(opts.ready_timeout_s)
    except BaseException:
        sysm.stop(grace_s=20)
        raise
    return sysm
