"""raypd-pd-tier: raypd-pd's flags plus a KV disk tier in a fresh temporary folder per launch,
removed when the system stops and when it fails to start; the Ray cluster a system's log names (where
its nodes' tier totals are read)."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from raypd.benchmarks.serve import systems
from raypd.benchmarks.serve.systems import LaunchError, LaunchOptions, command, launch

# A stand-in for `raypd serve`: writes into the tier folder it was given as a node would, serves GET
# /v1/models on port argv[1] and a moment later logs its Ray cluster, as raypd serve does; "fail"
# exits at once.
FAKE_SERVE = textwrap.dedent("""
    import http.server, json, pathlib, sys, threading, time
    port, tier, mode = int(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
    (tier / "prefill-0").mkdir()
    (tier / "prefill-0" / "1.kv").write_bytes(b"x" * 100)
    if mode == "fail":
        sys.exit(3)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    threading.Thread(target=http.server.HTTPServer(("127.0.0.1", port), H).serve_forever, daemon=True).start()
    time.sleep(1.5)
    print("raypd serve: Ray cluster: 192.0.2.7:6379", flush=True)
    threading.Event().wait()
""")


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_the_tier_system_is_raypd_pd_with_a_tier(tmp_path):
    opts = LaunchOptions(raypd_args=("--kv-cache-memory", "400"))
    pd = command("raypd-pd", 8000, opts)
    tier = command("raypd-pd-tier", 8000, opts, tier_dir=tmp_path)
    assert _flag(tier, "--kv-tier-dir") == str(tmp_path) and _flag(pd, "--kv-tier-dir") is None
    assert [a for a in tier if a not in ("--kv-tier-dir", str(tmp_path))] == pd
    assert _flag(pd, "--kv-cache-memory") == "400" and pd[-2:] == ["--kv-cache-memory", "400"]  # the user's last


@pytest.fixture
def fake_serve(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """launch() starts FAKE_SERVE in place of `raypd serve`; yields the tier folders it was given."""
    given: list[Path] = []

    def fake_command(name: str, port: int, opts: LaunchOptions, tier_dir: Path | None = None) -> list[str]:
        assert name in systems.KV_TIER_SYSTEMS and tier_dir is not None and tier_dir.is_dir()
        given.append(tier_dir)
        return [sys.executable, "-c", FAKE_SERVE, str(port), str(tier_dir), opts.raypd_args[0]]
    monkeypatch.setattr(systems, "command", fake_command)
    return given


def test_the_tier_folder_lives_as_long_as_the_system(fake_serve, tmp_path):
    sysm = launch("raypd-pd-tier", LaunchOptions(raypd_args=("serve",), ready_timeout_s=60), tmp_path)
    try:
        (folder,) = fake_serve
        assert sysm.scratch == folder and (folder / "prefill-0" / "1.kv").exists()
        assert sysm.ray_address() == "192.0.2.7:6379"
    finally:
        assert sysm.stop(grace_s=5) == []
    assert not folder.exists()


def test_the_tier_folder_goes_when_the_start_fails(fake_serve, tmp_path):
    with pytest.raises(LaunchError, match="exited with 3"):
        launch("raypd-pd-tier", LaunchOptions(raypd_args=("fail",), ready_timeout_s=60), tmp_path)
    (folder,) = fake_serve
    assert not folder.exists()


def test_each_launch_gets_a_fresh_folder(fake_serve, tmp_path):
    for _ in range(2):
        launch("raypd-pd-tier", LaunchOptions(raypd_args=("serve",), ready_timeout_s=60), tmp_path).stop(grace_s=5)
    assert len(set(fake_serve)) == 2 and not any(f.exists() for f in fake_serve)
