"""Run a `raypd bench` command as a user runs it, in a process of its own (a test process that already
started Ray clusters carries Ray state a bench should not inherit), for the benches' end-to-end tests."""
from __future__ import annotations

import signal
import subprocess
import sys


def run_bench(args: list[str], timeout_s: float = 900) -> tuple[int, str, str]:
    """`raypd bench ARGS...` to its end: (exit status, stdout, stderr). Past `timeout_s` it gets a
    Ctrl-C (each bench stops its servers on it) and the test fails with the end of its stderr."""
    cmd = [sys.executable, "-m", "raypd", "bench", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=180)
        raise AssertionError(f"raypd bench {args[0]} did not finish within {timeout_s:.0f} s:\n{stderr[-3000:]}") \
            from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout, stderr
