"""EndpointHealth: whether this endpoint's own backend is broken, judged from its registrations and
from whether its host had a network when the backend was made.

Why: a NIXL agent's UCX worker picks its network interfaces once, when it is made. A process started
while its host's link had no carrier (a cut veth, a NIC coming up) gets a worker whose only
transports are self/memory and tcp over `lo`, and it reaches no other host ever again, although the
link comes back: the sender's backend refuses every receiver ("UCX endpoint create failed ...
Destination is unreachable"). A receiver made during a cut is the mirror image: its metadata names no
network address, and every sender's backend refuses it. Nothing inside the process mends either; a
new process (a new worker) does, which is what the node does with a broken endpoint (node_core.py).

The rule: the endpoint was made while no interface of its host but loopback had a carrier
(host_network_up() is False), and since then its backend refused a peer and accepted none -> broken,
for good. Both halves are needed. Refusals alone cannot tell which side is broken: two receivers made
during a cut get a healthy sender refusing both, and condemning it would restart healthy nodes in a
loop while the broken ones stay. A start without a network alone condemns nothing: a backend that
reaches its peers (the interface came up before the worker looked, or the backend needs none) is
healthy, whatever the start saw. One acceptance proves the backend reaches the network.

What counts as the backend's refusal:
- sender: add_peer raised on a Register, except LayoutError (two pools that disagree are the
  deployment's configuration, which no restart mends); the protocol's own refusals (a name that is
  not the routing id, another backend, max_peers) never reach add_peer.
- receiver: a Registered(ok=False) whose reason the sender marked as its backend's (add_peer_failed
  puts the mark there).

One thread (the endpoint's loop) records; `broken` is read from any thread (one attribute).
"""
from __future__ import annotations

import logging
from pathlib import Path

from raypd.kvtransfer.errors import LayoutError

log = logging.getLogger(__name__)

# The start of a Registered.error that says the sender's backend could not add the receiver.
_BACKEND_REFUSAL = "backend refused the peer: "
SYS_NET = Path("/sys/class/net")


def host_network_up(net: Path = SYS_NET) -> bool | None:
    """Whether an interface of this host (this network namespace) other than loopback has a carrier
    now; None where the kernel does not say (no /sys/class/net: not Linux)."""
    if not net.is_dir():
        return None
    for dev in net.iterdir():
        if dev.name == "lo":
            continue
        try:
            if (dev / "carrier").read_text().strip() == "1":
                return True
        except OSError:   # an interface that is administratively down refuses the read (EINVAL)
            continue
    return False


class EndpointHealth:
    def __init__(self, endpoint: str, made_offline: bool):
        """`made_offline`: the backend was made while host_network_up() said False."""
        self.endpoint = endpoint
        self.made_offline = made_offline
        self._accepted = False
        self._broken: str | None = None

    @classmethod
    def now(cls, endpoint: str) -> EndpointHealth:
        """For a backend about to be made: what the host's interfaces say at this moment."""
        return cls(endpoint, made_offline=host_network_up() is False)

    @property
    def broken(self) -> str | None:
        """Why this endpoint's backend is broken, or None while it may still be healthy."""
        return self._broken

    def peer_accepted(self, peer: str) -> None:
        """The backend took a peer (sender: add_peer returned; receiver: a sender registered it)."""
        self._accepted = True

    def add_peer_failed(self, peer: str, e: Exception) -> str:
        """Sender: add_peer raised `e` for `peer`; counts it unless it is a layout mismatch. The
        Registered.error to send, marked as the backend's refusal when it counted."""
        why = f"{type(e).__name__}: {e}"
        if isinstance(e, LayoutError):
            return why
        why = _BACKEND_REFUSAL + why
        self._refused(peer, why)
        return why

    def registration_refused(self, peer: str, reason: str) -> None:
        """Receiver: the sender `peer` refused this endpoint's registration for `reason`."""
        if reason.startswith(_BACKEND_REFUSAL):
            self._refused(peer, reason)

    def _refused(self, peer: str, reason: str) -> None:
        if not self.made_offline or self._accepted or self._broken is not None:
            return
        self._broken = (f"it was made while its host had no network (no interface but loopback had a carrier), "
                        f"and its backend has reached no peer since: {peer} refused it: {reason}")
        log.error("%s: endpoint broken, only a new process mends it: %s", self.endpoint, self._broken)
