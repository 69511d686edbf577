"""Prefix copies between prefill nodes (the Conductor's hot-prefix migration and remote fetch).

The bytes go node to node through kvtransfer, never through the Conductor. The source exports the
cached blocks of a prefix through its KVSender (like a PD request with no compute); the target
imports them through a KVReceiver of its own into reserved blocks, then inserts them into its radix
cache, whose BlockStored event tells the Conductor's index. Either side failing leaves both as they
were: the source unlocks, the target frees its reservation.

    export: matched + locked ─destination arrived─> writing ─room SUCCESS / FAILED─> unlocked, reply
    import: reserved ─room SUCCESS─> inserted into the radix cache, reply(ok)
                     ─room FAILED──> reservation freed, reply(error)
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raypd.engine.cache.radix_cache import RadixNode
from raypd.kvtransfer import KVReceiver, KVSender, TransferState
from raypd.node.streams import Reply
from raypd.protocol.messages import PrefillResult

if TYPE_CHECKING:  # torch: only a type here; a process that holds a node's handle imports this module
    from raypd.engine.engine import LLMEngine

S = TransferState


@dataclass(slots=True)
class _Export:
    room: int
    node: RadixNode | None  # None: refused; the room only exists to tell the target at once
    blocks: list[int]
    reply: Reply
    sent: bool = False


@dataclass(slots=True)
class _Import:
    room: int
    token_ids: list[int]
    reply: Reply
    started: float


class PrefixCopies:
    """Owned by a PrefillNode; every method runs on its engine thread."""

    def __init__(self, engine: LLMEngine, sender: KVSender, receiver: KVReceiver):
        self.engine = engine
        self.sender = sender
        self.receiver = receiver
        self.exports: dict[int, _Export] = {}
        self.imports: dict[int, _Import] = {}
        self.num_exported = self.num_imported = self.num_failed = 0

    def export(self, token_ids: list[int], room: int, reply: Reply) -> None:
        bs = self.engine.config.block_size
        want = len(token_ids) // bs
        cache = self.engine.prefix_cache
        match = cache.match_prefix(token_ids, want)
        try:
            self.sender.add_room(room)
        except Exception as e:  # noqa: BLE001 - duplicate room id: this copy fails alone
            reply.set(PrefillResult(f"export-{room}", False, str(e)))
            return
        if want == 0 or match.num_blocks < want:
            reason = f"prefix not cached here: {match.num_blocks} of {want} blocks"
            # Keep the room until the importer's destination arrives, then abort it, so the
            # importer frees its blocks at once instead of waiting out its timeout.
            self.exports[room] = _Export(room, None, [], reply)
            reply.set(PrefillResult(f"export-{room}", False, reason))
            return
        cache.lock(match.node)  # not evictable while its bytes may be read
        self.exports[room] = _Export(room, match.node, list(match.blocks), reply)

    def import_(self, token_ids: list[int], room: int, source_address: str, reply: Reply) -> None:
        bs = self.engine.config.block_size
        ids = list(token_ids[:len(token_ids) // bs * bs])
        try:
            blocks = self.engine.reserve(("import", room), len(ids)) if ids else None
            if blocks is None:
                raise RuntimeError("no free KV blocks for the prefix" if ids else "prefix shorter than one block")
            self.receiver.add_room(room, source_address, blocks)
        except Exception as e:  # noqa: BLE001 - no memory, bad address: this copy fails alone
            self.engine.unreserve(("import", room))
            reply.set(PrefillResult(f"import-{room}", False, str(e)))
            return
        self.imports[room] = _Import(room, ids, reply, time.time())

    def abort(self, room: int) -> None:
        if room in self.exports:
            self.sender.abort(room, "migration aborted")
        if room in self.imports:
            self.receiver.abort(room, "migration aborted")

    def tick(self) -> bool:
        """Advance every copy; True while any is in flight."""
        for room, ex in list(self.exports.items()):
            state = self.sender.poll(room)
            if not ex.sent and state == S.WAITING_FOR_INPUT:
                if ex.node is None:
                    self.sender.abort(room, "prefix not cached at the source")
                else:
                    self.sender.send(room, ex.blocks)
                ex.sent = True
            elif state.is_terminal:
                self._end_export(ex, state)
        for room, im in list(self.imports.items()):
            state = self.receiver.poll(room)
            if state.is_terminal:
                self._end_import(im, state)
        return bool(self.exports or self.imports)

    def _end_export(self, ex: _Export, state: TransferState) -> None:
        del self.exports[ex.room]
        if ex.node is None:  # refused at once; the caller already has its answer
            self.sender.release(ex.room)
            return
        self.engine.prefix_cache.unlock(ex.node)
        reason = self.sender.failure_reason(ex.room)
        self.sender.release(ex.room)
        ok = state == S.SUCCESS
        self.num_exported += ok
        self.num_failed += not ok
        ex.reply.set(PrefillResult(f"export-{ex.room}", ok, None if ok else reason or "export failed",
                                   len(ex.blocks) * self.engine.config.block_size))

    def _end_import(self, im: _Import, state: TransferState) -> None:
        del self.imports[im.room]
        reason = self.receiver.failure_reason(im.room)
        self.receiver.release(im.room)
        key = ("import", im.room)
        ok = state == S.SUCCESS
        if ok:
            # The tree takes its own reference on blocks it did not have; blocks of positions it
            # already held are duplicates and go back to the pool with the reservation.
            self.engine.prefix_cache.insert(im.token_ids, self.engine.reservations[key])
        self.engine.unreserve(key)
        self.num_imported += ok
        self.num_failed += not ok
        im.reply.set(PrefillResult(f"import-{im.room}", ok, None if ok else reason or "import failed",
                                   len(im.token_ids), {"total_s": time.time() - im.started}))
