"""Lab hosts as machines an operator reaches over ssh, for the cluster launcher on premises (`ray up`
of cluster/cluster.local.yaml): each host runs sshd (Debian's openssh-server) on its own address, as
the first process of a PID namespace and a mount namespace of its own, so that whatever the launcher
runs there sees that host alone.

Why more than the lab's network namespaces:
- `ray stop`, which the launcher runs before every `ray start` and on the head at `ray down`, stops
  every Ray process it finds in /proc. In a host that shared this machine's process table it would stop
  the other hosts' Ray, and any other Ray on this machine; in its own PID namespace, with its own /proc,
  a host sees only its own processes.
- Ray and the launcher keep state in /tmp (/tmp/ray: `ray_current_cluster`, which `--address auto`
  reads, and the launcher's cluster state; /tmp/ray_ssh_*: its ssh connections) and in the home
  (~/ray_bootstrap_config.yaml, ~/ray_bootstrap_key.pem, ~/.ray, ~/.ssh), and sshd wants its
  privilege-separation folder /run/sshd. So a host's /tmp, /root and /run are folders of its own in the
  lab's folder (`root_of`, `tmp_of`), bound over this machine's in the host's mount namespace: nothing
  a host writes there lands outside the lab, and it goes with the lab.
- Some paths stay this machine's on every host, as a shared disk would: the lab's folder (sshd's
  files), this Python's installation (pyenv keeps it under /root), and what the caller names (a model
  folder under /tmp). Each is bound back at its own path.

sshd's config, host key and the authorized key are in the lab's folder, never in /etc/ssh or
/root/.ssh; root logs in with the lab's key (`key`) only. Each host's ~/.bashrc puts this Python's bin
folder first on PATH (Debian's /etc/profile resets PATH for login shells, and the launcher runs every
command in `bash --login -i` after sourcing ~/.bashrc) and exports the environment the caller gives.

    SshHosts(lab, ...) ─start()─> STARTED (each host took a login) ─ lab.close() ends every process
                                                                        and removes every folder
The mounts live only in the hosts' namespaces (private propagation, checked at start), so they end
with the hosts' processes and the lab's folder is removed as plain folders.
"""
from __future__ import annotations

import enum
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from raypd.benchmarks.lab.hosts import Host, Lab, LabError, LabState

SSHD = Path("/usr/sbin/sshd")
USER = "root"
# This machine's folders each host has its own of; /tmp last, since the hosts' folders live in it.
PRIVATE = (Path("/root"), Path("/run"), Path("/tmp"))
START_TIMEOUT_S = 30.0
LOGIN_ENV = {"HOME": "/root", "USER": USER, "LOGNAME": USER, "SHELL": "/bin/bash", "LANG": "C.UTF-8",
             "TERM": "dumb", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def unavailable_reason() -> str | None:
    """Why sshd cannot run in the lab's hosts here, or None when it can (the lab's own reasons aside)."""
    if not SSHD.exists():
        return f"{SSHD} is not installed (Debian: apt-get install openssh-server)"
    missing = [tool for tool in ("ssh", "ssh-keygen", "rsync", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (Debian: openssh-client, rsync, util-linux)"
    return None


class SshState(enum.IntEnum):
    NEW = 0
    STARTED = 1


class SshHosts:
    """sshd on each of `hosts` (default: all the lab's); `shared` paths are this machine's on every
    host; `env` is exported by every login shell on every host."""

    def __init__(self, lab: Lab, hosts: Sequence[Host] | None = None, shared: Sequence[Path] = (),
                 env: Mapping[str, str] | None = None):
        assert lab.state is LabState.BUILT, lab.state
        self.lab = lab
        self.hosts = list(lab.hosts if hosts is None else hosts)
        self.shared = [lab.folder, Path(sys.prefix), Path(sys.base_prefix), *shared]
        self.env = dict(env or {})
        self.state = SshState.NEW
        self.folder = lab.folder / "ssh"
        self.key = self.folder / "id_ed25519"      # the user key: root logs in to every host with it
        self._init_pid: dict[int, int] = {}        # host index -> its sshd's pid here (pid 1 in the host)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start sshd on every host; returns once each takes a login with `key`."""
        assert self.state is SshState.NEW, self.state
        self.folder.mkdir(mode=0o700)
        for path in (self.key, self.folder / "host_ed25519"):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "raypd-lab", "-f", str(path)])
        pub = (self.folder / "id_ed25519.pub").read_text()
        procs = {}
        for host in self.hosts:
            self._make_root(host, pub)
            procs[host.index] = self._start_sshd(host)
        for host in self.hosts:
            self._init_pid[host.index] = self._wait_init(host, procs[host.index], timeout_s)
        _check_private_mounts(self.lab.folder)
        for host in self.hosts:
            self._wait_login(host, timeout_s)
        self.state = SshState.STARTED

    # where a host's own folders are, seen from this machine
    def root_of(self, host: Host) -> Path:
        """The folder that is the host's /root (its home)."""
        return self.lab.host_folder(host) / "root"

    def tmp_of(self, host: Host) -> Path:
        return self.lab.host_folder(host) / "tmp"

    # operating a host
    def run(self, host: Host, command: str, timeout_s: float = 120.0, env: Mapping[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run `command` in a login shell on the host, as root at its console would (its namespaces,
        /root as the working folder, a fresh environment plus `env`); its stdout and stderr as text."""
        argv = ["nsenter", "-t", str(self._init_pid[host.index]), "-m", "-p", "-n", "--wdns=/root",
                "env", "-i", *[f"{k}={v}" for k, v in {**LOGIN_ENV, **(env or {})}.items()],
                "bash", "--login", "-c", command]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise LabError(f"`{command}` on {host.ip} did not finish within {timeout_s:.0f} s:\n"
                           f"{_text(e.stdout)[-2000:]}{_text(e.stderr)[-2000:]}") from e
        if check and done.returncode != 0:
            raise LabError(f"`{command}` on {host.ip} exited with {done.returncode}:\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done

    def ssh_argv(self, host: Host) -> list[str]:
        """`ssh` to the host as root with the lab's key, reading no ssh config of this machine's."""
        return ["ssh", "-F", "/dev/null", "-i", str(self.key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "ConnectTimeout=5", f"{USER}@{host.ip}"]

    # starting
    def _make_root(self, host: Host, authorized_key: str) -> None:
        """The host's /root, /tmp and /run, with the mount points of the shared paths in them."""
        home = self.root_of(host)
        (home / ".ssh").mkdir(mode=0o700, parents=True)
        (home / ".ssh" / "authorized_keys").write_text(authorized_key)
        (home / ".ssh" / "authorized_keys").chmod(0o600)
        home.chmod(0o700)
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.env.items())
        bin_dir = Path(sys.executable).parent
        (home / ".bashrc").write_text(
            "# A lab host (benchmarks/lab/ssh_hosts.py): this Python's bin folder first on PATH.\n"
            f'case ":$PATH:" in *":{bin_dir}:"*) ;; *) export PATH="{bin_dir}:$PATH" ;; esac\n' + exports)
        (home / ".bash_profile").write_text(". ~/.bashrc\n")
        self.tmp_of(host).mkdir(mode=0o1777)
        self.tmp_of(host).chmod(0o1777)                  # as /tmp is (mkdir applies the umask)
        (self.lab.host_folder(host) / "run" / "sshd").mkdir(mode=0o755, parents=True)  # sshd's privsep folder
        for _, target in self._shared_binds(host):
            target.mkdir(parents=True, exist_ok=True)
        config = self.folder / f"sshd_config.h{host.index}"
        config.write_text(
            f"ListenAddress {host.ip}\nPort 22\nHostKey {self.folder / 'host_ed25519'}\nPidFile none\n"
            f"PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nX11Forwarding no\nPrintMotd no\nPrintLastLog no\n"
            "AuthorizedKeysFile .ssh/authorized_keys\nMaxStartups 100\nMaxSessions 100\n")

    def _shared_binds(self, host: Host) -> list[tuple[Path, Path]]:
        """(this machine's path, the mount point in the host's own folder) of each shared path that
        lies in a folder the host has its own of."""
        binds = []
        for path in (p.resolve() for p in self.shared):
            for private in PRIVATE:
                if path.is_relative_to(private):
                    binds.append((path, self.lab.host_folder(host) / private.name / path.relative_to(private)))
        return binds

    def _start_sshd(self, host: Host) -> subprocess.Popen:
        own = self.lab.host_folder(host)
        steps = ["set -e", "mount --make-rprivate /"]
        steps += [f"mount --bind {shlex.quote(str(s))} {shlex.quote(str(t))}" for s, t in self._shared_binds(host)]
        steps += [f"mount --rbind {shlex.quote(str(own / p.name))} {p}" for p in PRIVATE]
        steps += [f"exec {SSHD} -D -e -f {shlex.quote(str(self.folder / f'sshd_config.h{host.index}'))}"]
        log = open(own / "sshd.log", "w")
        try:
            return self.lab.popen(host, ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                                         "sh", "-c", "\n".join(steps)], stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    def _wait_init(self, host: Host, proc: subprocess.Popen, timeout_s: float) -> int:
        """The pid, here, of the host's first process (unshare's child, which becomes sshd)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LabError(f"sshd on {host.ip} exited with {proc.returncode}:\n{self._log(host)}")
            try:
                child = next(iter(psutil.Process(proc.pid).children()), None)
                if child is not None and child.exe() == str(SSHD):
                    return child.pid
            except psutil.Error:   # unshare or its child exited meanwhile: poll() says so next
                pass
            time.sleep(0.05)
        raise LabError(f"sshd on {host.ip} did not start within {timeout_s:.0f} s:\n{self._log(host)}")

    def _wait_login(self, host: Host, timeout_s: float) -> None:
        """Until root logs in over ssh from the host itself and lands in the host's own /root."""
        deadline = time.monotonic() + timeout_s
        while True:
            done = self.run(host, shlex.join([*self.ssh_argv(host), "cat ~/.ssh/authorized_keys"]), check=False,
                            timeout_s=timeout_s)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise LabError(f"no ssh login to {host.ip} within {timeout_s:.0f} s: {done.stderr[-500:]}\n"
                               f"{self._log(host)}")
            time.sleep(0.2)
        if done.stdout != (self.root_of(host) / ".ssh" / "authorized_keys").read_text():
            raise LabError(f"an ssh login to {host.ip} did not land in the host's own /root")

    def _log(self, host: Host) -> str:
        return (self.lab.host_folder(host) / "sshd.log").read_text(errors="replace")[-2000:]


def _check_private_mounts(folder: Path) -> None:
    """The hosts' mounts must not show in this machine's mount table: if they did, removing the lab's
    folder would reach through them into the shared paths (this Python, say). Unmount them and stop."""
    leaked = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4].startswith(f"{folder}/")]
    for mount_point in reversed(leaked):
        subprocess.run(["umount", "-l", mount_point], capture_output=True, timeout=10)
    if leaked:
        raise LabError(f"the lab hosts' mounts showed outside their namespaces: {leaked[:5]}")


def _run(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` exited with {done.returncode}: {done.stderr.strip()[-500:]}")


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else out or ""
