"""conductor/ must import no torch: the Conductor runs on a CPU-only head node."""
from __future__ import annotations

import subprocess
import sys


def test_conductor_imports_no_torch():
    code = ("import sys, raypd.conductor, raypd.conductor.core, raypd.conductor.actor, raypd.conductor.policies, "
            "raypd.conductor.sim.simulator, raypd.conductor.sim.report, raypd.protocol.messages; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
