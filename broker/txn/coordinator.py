"""The transaction coordinator (KIP-98, with KIP-360's epoch bumps and KIP-890 part 1's check
that a transactional write goes to a partition already added to its transaction).

Its state (broker.txn.state) lives in the metadata store: every change is written there
before it is answered or acted on, so another broker can take the coordinator over from the
same rows. Each transactional id's requests run one at a time (a lock per id). Ending a
transaction: the Prepare* state is written, then a marker is appended to every partition of
the transaction through the log's durable path, then the Complete* state is written with the
move of its pending group offsets (one metadata transaction). A coordinator that stops in
between finishes the markers when it starts again (`start`), and the expiry loop aborts
transactions open longer than their timeout, bumping the epoch (the producer is fenced).

In a cluster a transactional id is coordinated by one broker, placed by the rule groups
follow (broker.cluster.coordinators: its slot's live broker of highest rendezvous weight);
every request about an id placed elsewhere answers NOT_COORDINATOR. When the live brokers
change, ids placed elsewhere now are dropped from memory and ids placed here now are read
from the metadata database: a Prepare* transaction is completed by its new coordinator, an
Ongoing one goes on (or times out) there. A marker for a partition led by another broker is
sent to that leader (WriteTxnMarkers, broker.txn.remote), asked again after each new cluster
view until every partition has it; only then is the transaction Complete*.

Each id has a coordinator epoch, bumped in the metadata transaction in which a broker takes
the id over (reads its row to coordinate it: `sync`, or `_conflict` on finding the row changed
by another coordinator); every marker carries it. A partition's leader refuses a marker older
than one it wrote for the producer (TRANSACTION_COORDINATOR_FENCED, broker.txn.index): a
coordinator that lost the id cannot end the producer's next transaction there with a late
marker. Told so, the coordinator stops: the id is dropped from memory, nothing more is written
for it (EndTxn answers NOT_COORDINATOR), and the ids are read again at the next `sync`.

TxnOffsetCommit goes to the group's coordinator (which may be another broker): it checks the
transaction in the metadata database and keeps the offsets pending; the transaction
coordinator moves them into the committed offsets when the transaction completes, then tells
each group's coordinator (a WriteTxnMarkers for the group's slot), which reads the group's
offsets again; a coordinator that was never told finds the rows gone at its next sweep.

A partition's leader checks a transactional produce (KIP-890 part 1) against the id's row
when the id is coordinated elsewhere, once a transaction per partition (until a marker for
the producer is written there, or the partition's leader epoch changes).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time

from broker.cluster.coordinators import coordinator_of, is_local, slot_of
from broker.cluster.model import NO_LEADER, BrokerInfo, ClusterView
from broker.engine import AppendResult, StorageEngine
from broker.errors import ErrorCode, KafkaError
from broker.groups.offsets import OffsetStore
from broker.metadata.txns import PendingOffsetRow, TxnConflictError
from broker.txn import remote
from broker.txn.state import MAX_EPOCH, MAX_TIMEOUT_MS, TxnBackend, TxnMeta, TxnState, now_ms

log = logging.getLogger(__name__)

MARKER_TIMEOUT_S = 30.0  # markers still missing then: EndTxn fails, the expiry loop goes on
GROUP_NOTICE_TIMEOUT_S = 10.0  # telling groups' coordinators; the sweep catches up after
SWEEP_ROUNDS = 5  # expiry rounds between sweeps of offsets pending for others' transactions
VIEW_WAIT_S = 0.5  # a marker that could not be written: asked again after the next view
# the marker may be written once the view changes: retried (anything else fails EndTxn)
RETRIABLE = frozenset({
    ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
    ErrorCode.unknown_topic_or_partition, ErrorCode.network_exception,
    ErrorCode.request_timed_out, ErrorCode.kafka_storage_error, ErrorCode.not_coordinator,
    ErrorCode.coordinator_not_available, ErrorCode.unknown_server_error,
})
_UNSYNCED: tuple[int, ...] = (-2,)  # no live brokers seen yet


def _nodes(view: ClusterView | None) -> tuple[int, ...]:
    return () if view is None else tuple(sorted(b.node_id for b in view.brokers))


def _address(view: ClusterView | None, node_id: int) -> str | None:
    for b in () if view is None else view.brokers:
        if b.node_id == node_id:
            return f"{b.host}:{b.port}"
    return None


class TxnCoordinator:
    def __init__(
        self,
        storage: StorageEngine,
        backend: TxnBackend,
        offsets: OffsetStore,
        check_interval_s: float = 1.0,
        node_id: int = 0,
    ) -> None:
        self.storage = storage
        self.backend = backend
        self.offsets = offsets
        self.check_interval_s = check_interval_s
        self.node_id = node_id
        self.txns: dict[str, TxnMeta] = {}  # the ids this broker coordinates
        # transactional id -> (group, topic, partition) -> offset pending until it commits
        # (taken here as the groups' coordinator), and the producer id of each such id
        self.pending: dict[str, dict[tuple[str, str, int], PendingOffsetRow]] = {}
        self.pending_pids: dict[str, int] = {}
        # (producer id, topic, partition) -> (epoch, leader epoch): a transactional produce
        # of an id coordinated elsewhere checked against its row; dropped by a marker
        self.verified: dict[tuple[int, str, int], tuple[int, int | None]] = {}
        self.marker_timeout_s = MARKER_TIMEOUT_S
        self._nodes = _UNSYNCED
        self._sync_lock = asyncio.Lock()
        self._rounds = 0
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the state, finish transactions stopped between their markers, start the
        expiry loop."""
        await self.sync()
        await self.check_once()
        self._task = asyncio.create_task(self._loop(), name="txn-expiry")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_s)
            try:
                await self.check_once()
            except Exception as e:  # logged; the next round tries again
                log.warning("transaction expiry round failed: %r", e)

    async def check_once(self) -> None:
        """Take the ids placed here since the last view; complete transactions left in
        Prepare*; abort (fencing) expired ones; now and then, sweep offsets pending for
        transactions that ended without this broker being told."""
        await self.sync()
        self._rounds += 1
        if self.pending and self._rounds % SWEEP_ROUNDS == 0:
            await self.sweep_pending()
        now = now_ms()
        for tid, meta in list(self.txns.items()):
            if not self.is_local(tid) and not self._lock(tid).locked():
                del self.txns[tid]  # kept by a request that was under way when it moved
                continue
            if not (meta.state.preparing or meta.expired(now)) or self._lock(tid).locked():
                continue
            async with self._lock(tid):
                found = self.txns.get(tid)
                if found is None:  # placed elsewhere meanwhile
                    continue
                meta = found
                try:
                    if meta.state.preparing:
                        await self._complete(meta)
                    elif meta.expired(now_ms()):
                        log.info("transaction %r (producer %d) timed out: aborting",
                                 tid, meta.producer_id)
                        await self._end(meta, commit=False, fence=True)
                except KafkaError as e:
                    log.warning("transaction %r not completed yet: %s", tid, e)

    def _lock(self, tid: str) -> asyncio.Lock:
        return self._locks.setdefault(tid, asyncio.Lock())

    # -- placement -------------------------------------------------------------------------
    def is_local(self, tid: str) -> bool:
        return is_local(tid, self.storage.cluster_view(), self.node_id)

    async def here(self, tid: str) -> None:
        """NOT_COORDINATOR unless this broker coordinates `tid`; the ids placed here since
        the live brokers last changed are read from the metadata database first."""
        view = self.storage.cluster_view()
        if not is_local(tid, view, self.node_id):
            raise KafkaError(ErrorCode.not_coordinator,
                             f"transactional id {tid!r} is coordinated by another broker")
        await self.sync()

    async def sync(self) -> None:
        """When the live brokers changed: drop the ids placed elsewhere now, read those placed
        here now (and every pending transactional offset not known yet)."""
        if _nodes(self.storage.cluster_view()) == self._nodes:
            return
        async with self._sync_lock:
            view = self.storage.cluster_view()
            nodes = _nodes(view)
            if nodes == self._nodes:
                return
            known = set(self.txns)
            taken: set[str] = set()

            def take(tid: str) -> bool:  # in the store's thread: this view, a copy of the ids
                if tid in known or not is_local(tid, view, self.node_id):
                    return False
                taken.add(tid)
                return True

            # the ids placed here in `view` and not held yet are taken over (coordinator
            # epoch bumped) in the metadata transaction that reads them
            rows, pending = await self.backend.take_txns(take)
            for tid in [t for t in self.txns if not is_local(t, view, self.node_id)]:
                del self.txns[tid]
            pids = {r.transactional_id: r.producer_id for r in rows}
            for r in rows:
                if r.transactional_id in taken and r.transactional_id not in self.txns:
                    self.txns[r.transactional_id] = TxnMeta.of(r)
            for p in pending:
                rows_of = self.pending.setdefault(p.transactional_id, {})
                rows_of.setdefault((p.group_id, p.topic, p.partition), p)
                if p.transactional_id in pids:
                    self.pending_pids.setdefault(p.transactional_id, pids[p.transactional_id])
            self._nodes = nodes  # a view changed meanwhile: the next sync takes its ids

    # -- requests --------------------------------------------------------------------------
    async def init_producer_id(
        self, tid: str, timeout_ms: int, producer_id: int, epoch: int
    ) -> tuple[int, int]:
        """The producer id and new epoch for a transactional id; an open transaction of an
        earlier epoch is aborted first (its producer is fenced)."""
        if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise KafkaError(ErrorCode.invalid_transaction_timeout, f"{timeout_ms} ms")
        await self.here(tid)
        async with self._lock(tid):
            meta = self.txns.get(tid)
            if meta is None:
                pid, _ = await self.storage.init_producer_id(-1, -1)
                new = TxnMeta(tid, pid, 0, timeout_ms)
                await self._save(new, [])
                return pid, 0
            if producer_id >= 0 and (
                producer_id != meta.producer_id or epoch not in (meta.epoch, meta.last_epoch)
            ):  # KIP-360: the producer's own id and epoch (or the one a timeout bumped)
                raise KafkaError(ErrorCode.producer_fenced,
                                 f"{tid!r} is producer {meta.producer_id} epoch {meta.epoch}")
            if meta.state.preparing:
                await self._complete(meta)
            elif meta.state == TxnState.ONGOING:
                await self._end(meta, commit=False, fence=True)
            meta = copy.deepcopy(self.txns[tid])
            if meta.epoch + 1 >= MAX_EPOCH:
                meta.producer_id, _ = await self.storage.init_producer_id(-1, -1)
                meta.epoch = 0
            else:
                meta.epoch += 1
            # a new instance (no id given) fences every earlier epoch; a producer bumping its
            # own epoch may retry with the one it had
            meta.last_epoch = epoch if producer_id >= 0 else -1
            meta.state, meta.timeout_ms = TxnState.EMPTY, timeout_ms
            meta.partitions, meta.groups, meta.start_ms = set(), set(), -1
            await self._save(meta, [])
            return meta.producer_id, meta.epoch

    async def add_partitions(
        self, tid: str, producer_id: int, epoch: int, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], ErrorCode]:
        """Add partitions to the open transaction (opening one): an error code for each."""
        await self.here(tid)
        async with self._lock(tid):
            meta = self._valid(tid, producer_id, epoch)
            unknown = set()
            for topic, partition in partitions:
                try:
                    self.storage.stream_id(topic, partition)
                except KafkaError:
                    unknown.add((topic, partition))
            if unknown:
                return {tp: ErrorCode.unknown_topic_or_partition if tp in unknown
                        else ErrorCode.operation_not_attempted for tp in partitions}
            new = self._opened(meta)
            added = [tp for tp in partitions if tp not in new.partitions]
            new.partitions.update(partitions)
            await self._save(new, added)
            return dict.fromkeys(partitions, ErrorCode.none)

    async def add_offsets(self, tid: str, producer_id: int, epoch: int, group_id: str) -> None:
        await self.here(tid)
        async with self._lock(tid):
            new = self._opened(self._valid(tid, producer_id, epoch))
            new.groups.add(group_id)
            await self._save(new, [])

    async def txn_offset_commit(
        self, tid: str, group_id: str, producer_id: int, epoch: int,
        entries: list[tuple[str, int, int, int, str | None]],
    ) -> None:
        """Offsets (topic, partition, offset, leader epoch, metadata) pending until the
        transaction commits. Asked of the group's coordinator: the transaction is read from
        the metadata database when another broker coordinates it."""
        async with self._lock(tid):
            if self.is_local(tid):
                await self.sync()
                meta = self._valid(tid, producer_id, epoch)
            else:
                row = await self.backend.load_txn(tid)
                meta = self._check(tid, None if row is None else TxnMeta.of(row),
                                   producer_id, epoch)
            if meta.state != TxnState.ONGOING or group_id not in meta.groups:
                raise KafkaError(ErrorCode.invalid_txn_state,
                                 f"group {group_id!r} was not added to {tid!r}'s transaction")
            rows = [PendingOffsetRow(tid, group_id, t, p, o, e, md) for t, p, o, e, md in entries]
            await self.backend.add_txn_offsets(rows)
            pending = self.pending.setdefault(tid, {})
            self.pending_pids[tid] = producer_id
            for r in rows:
                pending[(r.group_id, r.topic, r.partition)] = r

    async def end_txn(self, tid: str, producer_id: int, epoch: int, commit: bool) -> None:
        await self.here(tid)
        async with self._lock(tid):
            meta = self.txns.get(tid)
            if (meta is not None and not commit and meta.producer_id == producer_id
                    and epoch == meta.last_epoch >= 0 and meta.state == TxnState.COMPLETE_ABORT):
                return  # KIP-588: the producer aborts what its expiry aborted already
            meta = self._valid(tid, producer_id, epoch)
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            if meta.state == TxnState.ONGOING:
                await self._end(meta, commit, fence=False)
            elif meta.state == preparing:
                await self._complete(meta)  # a retry after the markers failed
            elif meta.state.preparing:
                raise KafkaError(ErrorCode.concurrent_transactions)
            elif meta.state != done:  # done: a retry of an EndTxn that succeeded
                raise KafkaError(ErrorCode.invalid_txn_state,
                                 f"{tid!r} is {meta.state.value}, cannot "
                                 f"{'commit' if commit else 'abort'}")

    async def verify_write(
        self, tid: str, producer_id: int, epoch: int, topic: str, part: int
    ) -> None:
        """`check_write` against this broker's state of `tid`, or, when another broker
        coordinates it, against its row in the metadata database (once per transaction and
        partition: until a marker of the producer is written here or the partition's leader
        epoch changes)."""
        if self.is_local(tid):
            await self.sync()
            try:
                self.check_write(tid, producer_id, epoch, topic, part)
                return
            except KafkaError:  # the id may have just moved here: its newest row decides
                row = await self.backend.load_txn(tid)
                known = self.txns.get(tid)
                if row is None or (known is not None and row.update_ms == known.update_ms):
                    raise
                self.check_write(tid, producer_id, epoch, topic, part, TxnMeta.of(row))
                return
        led = self.storage.led_epoch(topic, part)
        key = (producer_id, topic, part)
        if self.verified.get(key) == (epoch, led):
            return
        row = await self.backend.load_txn(tid)
        self.check_write(tid, producer_id, epoch, topic, part,
                         None if row is None else TxnMeta.of(row))
        self.verified[key] = (epoch, led)

    def marker_written(self, producer_id: int, topic: str, part: int) -> None:
        """A marker of the producer was written into the partition: its next transactional
        write there is checked again."""
        self.verified.pop((producer_id, topic, part), None)

    def check_write(
        self, tid: str, producer_id: int, epoch: int, topic: str, part: int,
        meta: TxnMeta | None = None,
    ) -> None:
        """A transactional produce: the producer must be the id's current one, with a
        transaction open that holds the partition (KIP-890 part 1). `meta`: the id's state
        (default: this coordinator's)."""
        meta = self.txns.get(tid) if meta is None else meta
        if meta is None or meta.producer_id != producer_id:
            raise KafkaError(ErrorCode.invalid_producer_id_mapping, f"{tid!r}: {producer_id}")
        if epoch != meta.epoch:
            raise KafkaError(ErrorCode.invalid_producer_epoch,
                             f"{tid!r}: epoch {epoch}, current {meta.epoch}")
        if meta.state != TxnState.ONGOING or (topic, part) not in meta.partitions:
            raise KafkaError(ErrorCode.invalid_txn_state,
                             f"{topic}-{part} is not part of {tid!r}'s open transaction")

    def has_pending_offset(self, group_id: str, topic: str, partition: int) -> bool:
        key = (group_id, topic, partition)
        return any(key in rows for rows in self.pending.values())

    # -- internals -------------------------------------------------------------------------
    def _valid(self, tid: str, producer_id: int, epoch: int) -> TxnMeta:
        return self._check(tid, self.txns.get(tid), producer_id, epoch)

    @staticmethod
    def _check(tid: str, meta: TxnMeta | None, producer_id: int, epoch: int) -> TxnMeta:
        if meta is None or meta.producer_id != producer_id:
            raise KafkaError(ErrorCode.invalid_producer_id_mapping, f"{tid!r}: {producer_id}")
        if epoch != meta.epoch:  # KIP-588: a timeout's bump is retriable, a new instance's not
            code = (ErrorCode.invalid_producer_epoch if epoch == meta.last_epoch >= 0
                    else ErrorCode.producer_fenced)
            raise KafkaError(code, f"{tid!r}: epoch {epoch}, current {meta.epoch}")
        return meta

    def _opened(self, meta: TxnMeta) -> TxnMeta:
        """A copy of meta with a transaction open (begun now unless one is)."""
        if meta.state.preparing:
            raise KafkaError(ErrorCode.concurrent_transactions)
        new = copy.deepcopy(meta)
        if new.state != TxnState.ONGOING:
            new.state, new.start_ms = TxnState.ONGOING, now_ms()
            new.partitions, new.groups = set(), set()
        return new

    def _next_version(self, meta: TxnMeta) -> int | None:
        """Stamp meta with a new version (update_ms, above the one read); the one read."""
        read = self.txns.get(meta.transactional_id)
        version = None if read is None else read.update_ms
        meta.update_ms = max(now_ms(), -1 if version is None else version + 1)
        return version

    async def _conflict(self, tid: str) -> KafkaError:
        """Another coordinator changed the id's row: take its state as it now is (and take
        the id over, a new coordinator epoch, while it is placed here)."""
        row = await (self.backend.take_txn(tid) if self.is_local(tid)
                     else self.backend.load_txn(tid))
        if row is None:
            self.txns.pop(tid, None)
        else:
            self.txns[tid] = TxnMeta.of(row)
        log.warning("transactional id %r was changed by another coordinator", tid)
        return KafkaError(ErrorCode.concurrent_transactions, f"{tid!r} changed meanwhile")

    async def _save(self, meta: TxnMeta, added: list[tuple[str, int]]) -> None:
        """Durably (over the version read), then in memory."""
        read = self._next_version(meta)
        try:
            await self.backend.save_txn(meta.row(), added, read)
        except TxnConflictError:
            raise await self._conflict(meta.transactional_id) from None
        self.txns[meta.transactional_id] = meta

    async def _end(self, meta: TxnMeta, commit: bool, fence: bool) -> None:
        new = copy.deepcopy(meta)
        if fence and new.epoch + 1 < MAX_EPOCH:
            # the markers carry the new epoch: the old producer is fenced (it may recover
            # from an expiry with an InitProducerId naming its epoch: last_epoch)
            new.last_epoch, new.epoch = new.epoch, new.epoch + 1
        new.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        await self._save(new, [])
        await self._complete(new)

    async def _complete(self, meta: TxnMeta) -> None:
        """Markers into every partition of the prepared transaction, then Complete*, then
        the groups' coordinators are told."""
        commit = meta.state == TxnState.PREPARE_COMMIT
        await self._write_markers(meta, commit)
        new = copy.deepcopy(meta)
        new.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        new.partitions, new.groups, new.start_ms = set(), set(), -1
        read = self._next_version(new)
        assert read is not None  # a prepared transaction's row exists
        try:
            moved = await self.backend.end_txn(new.row(), commit, read)
        except TxnConflictError:
            raise await self._conflict(new.transactional_id) from None
        self.txns[new.transactional_id] = new
        self.pending.pop(new.transactional_id, None)
        self.pending_pids.pop(new.transactional_id, None)
        for r in moved:  # the committed offsets become what OffsetFetch answers
            self.offsets.offsets.setdefault(r.group_id, {})[(r.topic, r.partition)] = r
        await self._tell_groups(meta, commit)

    # -- markers ---------------------------------------------------------------------------
    async def _write_markers(self, meta: TxnMeta, commit: bool) -> None:
        """A marker into every partition of the transaction: through this broker's log for
        the partitions it leads, WriteTxnMarkers to the leader of the others; what failed is
        asked again after the next cluster view, until `marker_timeout_s`."""
        todo = set(meta.partitions)
        deadline = time.monotonic() + self.marker_timeout_s
        while True:
            view = self.storage.cluster_view()
            failed = await self._marker_round(meta, commit, todo, view,
                                              deadline - time.monotonic())
            if not todo:
                return
            if ErrorCode.transaction_coordinator_fenced in failed.values():
                raise self._fenced(meta)
            fatal = {c for c in failed.values() if c not in RETRIABLE}
            if fatal:
                raise KafkaError(min(fatal, key=int), f"markers of {meta.transactional_id!r}"
                                 f" refused: {sorted(c.name for c in fatal)}")
            if time.monotonic() >= deadline:
                code = (ErrorCode.request_timed_out if ErrorCode.request_timed_out in
                        failed.values() else ErrorCode.kafka_storage_error)
                raise KafkaError(code, f"markers of {meta.transactional_id!r} missing in"
                                 f" {sorted(todo)}: {sorted({c.name for c in failed.values()})}")
            log.info("transaction %r: markers missing in %s (%s), asking again",
                     meta.transactional_id, sorted(todo), {c.name for c in failed.values()})
            await self._next_view(view, deadline)
            await self._still_mine(meta)

    def _fenced(self, meta: TxnMeta) -> KafkaError:
        """A leader refused a marker: a coordinator of a newer epoch wrote one for the
        producer. The id is not this broker's any more: no marker is asked again, nothing
        written; it is dropped, and every id read again at the next sync (taken over anew if
        this broker's view still places it here)."""
        tid = meta.transactional_id
        log.warning("transaction %r: markers of coordinator epoch %d fenced by a newer"
                    " coordinator", tid, meta.coordinator_epoch)
        self.txns.pop(tid, None)
        self._nodes = _UNSYNCED
        return KafkaError(ErrorCode.not_coordinator,
                          f"{tid!r}: another coordinator took it over")

    async def _still_mine(self, meta: TxnMeta) -> None:
        """Before markers are asked again: this broker still coordinates the id and its row
        is still the prepared state being completed (another coordinator that took the id
        over completes it itself; a late marker from here could reach a partition after
        the producer's next transaction began there)."""
        tid = meta.transactional_id
        if not self.is_local(tid):
            raise KafkaError(ErrorCode.not_coordinator, f"{tid!r} moved to another broker")
        row = await self.backend.load_txn(tid)
        if row is None or row.update_ms != meta.update_ms:
            raise await self._conflict(tid)

    async def _marker_round(
        self, meta: TxnMeta, commit: bool, todo: set[tuple[str, int]],
        view: ClusterView | None, timeout_s: float,
    ) -> dict[tuple[str, int], ErrorCode]:
        """One attempt at every partition of `todo`; those written are removed from it.
        Returns the others' error codes."""
        failed: dict[tuple[str, int], ErrorCode] = {}
        local: dict[tuple[str, int], asyncio.Future[AppendResult]] = {}
        by_leader: dict[str, list[tuple[str, int]]] = {}
        for tp in sorted(todo):
            topic, partition = tp
            try:
                local[tp] = self.storage.append_marker(
                    topic, partition, meta.producer_id, meta.epoch, commit,
                    meta.coordinator_epoch)
            except KafkaError as e:
                if e.code == ErrorCode.unknown_topic_or_partition:  # deleted: nothing to mark
                    todo.discard(tp)
                elif e.code == ErrorCode.not_leader_or_follower and view is not None:
                    address = self._leader(view, topic, partition)
                    if address is None:
                        failed[tp] = ErrorCode.leader_not_available
                    else:
                        by_leader.setdefault(address, []).append(tp)
                else:
                    failed[tp] = e.code
        answers = await asyncio.gather(*(asyncio.to_thread(remote.send, address, [
            remote.Marker(meta.producer_id, meta.epoch, commit, meta.coordinator_epoch,
                          tuple(tps))])
            for address, tps in by_leader.items()))
        for codes in answers:
            for (_, topic, partition), code in codes.items():
                if code == ErrorCode.none:
                    todo.discard((topic, partition))
                else:
                    failed[(topic, partition)] = code
        if local:
            _, late = await asyncio.wait(list(local.values()), timeout=max(timeout_s, 0.1))
            for tp, f in local.items():
                if f in late:
                    f.add_done_callback(lambda x: x.exception())  # retrieved: nobody waits
                    failed[tp] = ErrorCode.request_timed_out
                    continue
                exc = f.exception()
                if exc is None:
                    todo.discard(tp)
                    self.marker_written(meta.producer_id, *tp)
                else:
                    failed[tp] = (exc.code if isinstance(exc, KafkaError)
                                  else ErrorCode.kafka_storage_error)
        return failed

    def _leader(self, view: ClusterView, topic: str, partition: int) -> str | None:
        lead = view.leaders.get(self.storage.stream_id(topic, partition))
        if lead is None or lead.node_id == NO_LEADER:
            return None
        return _address(view, lead.node_id)

    async def _next_view(self, seen: ClusterView | None, deadline: float) -> None:
        """Wait for a cluster view other than `seen` (at most VIEW_WAIT_S, not past
        `deadline`)."""
        until = min(deadline, time.monotonic() + VIEW_WAIT_S)
        while self.storage.cluster_view() is seen and time.monotonic() < until:
            await asyncio.sleep(0.02)

    async def _tell_groups(self, meta: TxnMeta, commit: bool) -> None:
        """Tell the coordinator of each group of the transaction that it ended (a marker
        for the group's slot): it reads the group's committed offsets again. Best effort,
        bounded: a coordinator not told finds out at its next sweep."""
        me = BrokerInfo(self.node_id, "", 0, None)
        todo = {g for g in meta.groups}
        deadline = time.monotonic() + GROUP_NOTICE_TIMEOUT_S
        while todo:
            view = self.storage.cluster_view()
            by_broker: dict[str, set[str]] = {}
            for g in sorted(todo):
                b = coordinator_of(g, view, me)
                if b is None:
                    continue
                if b.node_id == self.node_id:  # its offsets were moved here already
                    todo.discard(g)
                else:
                    by_broker.setdefault(f"{b.host}:{b.port}", set()).add(g)
            answers = await asyncio.gather(*(asyncio.to_thread(remote.send, address, [
                remote.Marker(meta.producer_id, meta.epoch, commit, meta.coordinator_epoch,
                              tuple(sorted({(remote.GROUP_MARKER_TOPIC, slot_of(g))
                                            for g in groups})))])
                for address, groups in by_broker.items()))
            for groups, codes in zip(by_broker.values(), answers, strict=True):
                done = {p for (_, _, p), c in codes.items() if c == ErrorCode.none}
                todo -= {g for g in groups if slot_of(g) in done}
            if not todo:
                return
            if time.monotonic() >= deadline:
                log.warning("transaction %r ended; the coordinators of groups %s were not"
                            " told (they find out at their next sweep)",
                            meta.transactional_id, sorted(todo))
                return
            await self._next_view(view, deadline)

    async def group_marker(self, producer_id: int, commit: bool, slot: int) -> None:
        """The transaction of `producer_id` ended (WriteTxnMarkers for the groups of
        `slot`): the offsets pending for it here are dropped and, if it committed, its
        groups' committed offsets read again (the transaction coordinator moved them)."""
        tids = [t for t, pid in self.pending_pids.items() if pid == producer_id]
        keys = {k for t in tids for k in self.pending.get(t, {}) if slot_of(k[0]) == slot}
        if commit:
            view = self.storage.cluster_view()
            if tids:
                await self._reread({g for g, _, _ in keys}, keys)
            else:  # pending offsets never seen here: the slot's groups, all their offsets
                await self._reread({g for g in self.offsets.offsets if slot_of(g) == slot
                                    and is_local(g, view, self.node_id)}, None)
        for t in tids:
            rows = self.pending.get(t, {})
            for key in [k for k in rows if slot_of(k[0]) == slot]:
                del rows[key]
            if not rows:
                self.pending.pop(t, None)
                self.pending_pids.pop(t, None)

    async def sweep_pending(self) -> None:
        """Offsets pending here for transactions that ended meanwhile (their rows are gone
        from the metadata database): dropped, and their groups read again."""
        seen = {t: dict(rows) for t, rows in self.pending.items()}
        _, pending = await self.backend.load_txns()
        still = {p.transactional_id for p in pending}
        for tid, rows in seen.items():
            if tid in still or (self.is_local(tid) and self._lock(tid).locked()):
                continue
            current = self.pending.get(tid, {})
            for key, row in rows.items():
                if current.get(key) is row:
                    del current[key]
            await self._reread({g for g, _, _ in rows}, set(rows))
            if not current:
                self.pending.pop(tid, None)
                self.pending_pids.pop(tid, None)

    async def _reread(
        self, groups: set[str], keys: set[tuple[str, str, int]] | None
    ) -> None:
        """Read the committed offsets of `groups` coordinated here (only `keys` of them, if
        given: those a transaction wrote) from the metadata database into memory."""
        view = self.storage.cluster_view()
        groups = {g for g in groups if is_local(g, view, self.node_id)}
        if not groups:
            return
        for r in await self.offsets.meta.load_offsets():
            if r.group_id in groups and (keys is None
                                         or (r.group_id, r.topic, r.partition) in keys):
                self.offsets.offsets.setdefault(r.group_id, {})[(r.topic, r.partition)] = r
