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

On one broker every partition's leader is this broker; in a cluster the markers and the
produce check have to reach each partition's leader (Kafka's WriteTxnMarkers).
"""

from __future__ import annotations

import asyncio
import copy
import logging

from broker.engine import StorageEngine
from broker.errors import ErrorCode, KafkaError
from broker.groups.offsets import OffsetStore
from broker.metadata.txns import PendingOffsetRow, TxnConflictError
from broker.txn.state import MAX_EPOCH, MAX_TIMEOUT_MS, TxnBackend, TxnMeta, TxnState, now_ms

log = logging.getLogger(__name__)

COORDINATOR_EPOCH = 0  # one coordinator (Kafka: the leader epoch of the txn state partition)
MARKER_TIMEOUT_S = 30.0


class TxnCoordinator:
    def __init__(
        self,
        storage: StorageEngine,
        backend: TxnBackend,
        offsets: OffsetStore,
        check_interval_s: float = 1.0,
    ) -> None:
        self.storage = storage
        self.backend = backend
        self.offsets = offsets
        self.check_interval_s = check_interval_s
        self.txns: dict[str, TxnMeta] = {}
        # transactional id -> (group, topic, partition) -> offset pending until it commits
        self.pending: dict[str, dict[tuple[str, str, int], PendingOffsetRow]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the state, finish transactions stopped between their markers, start the
        expiry loop."""
        rows, pending = await self.backend.load_txns()
        self.txns = {r.transactional_id: TxnMeta.of(r) for r in rows}
        for p in pending:
            self.pending.setdefault(p.transactional_id, {})[(p.group_id, p.topic, p.partition)] = p
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
        """Complete transactions left in Prepare*; abort (fencing) expired ones."""
        now = now_ms()
        for tid, meta in list(self.txns.items()):
            if not (meta.state.preparing or meta.expired(now)) or self._lock(tid).locked():
                continue
            async with self._lock(tid):
                meta = self.txns[tid]
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

    # -- requests --------------------------------------------------------------------------
    async def init_producer_id(
        self, tid: str, timeout_ms: int, producer_id: int, epoch: int
    ) -> tuple[int, int]:
        """The producer id and new epoch for a transactional id; an open transaction of an
        earlier epoch is aborted first (its producer is fenced)."""
        if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise KafkaError(ErrorCode.invalid_transaction_timeout, f"{timeout_ms} ms")
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
        async with self._lock(tid):
            new = self._opened(self._valid(tid, producer_id, epoch))
            new.groups.add(group_id)
            await self._save(new, [])

    async def txn_offset_commit(
        self, tid: str, group_id: str, producer_id: int, epoch: int,
        entries: list[tuple[str, int, int, int, str | None]],
    ) -> None:
        """Offsets (topic, partition, offset, leader epoch, metadata) pending until the
        transaction commits."""
        async with self._lock(tid):
            meta = self._valid(tid, producer_id, epoch)
            if meta.state != TxnState.ONGOING or group_id not in meta.groups:
                raise KafkaError(ErrorCode.invalid_txn_state,
                                 f"group {group_id!r} was not added to {tid!r}'s transaction")
            rows = [PendingOffsetRow(tid, group_id, t, p, o, e, md) for t, p, o, e, md in entries]
            await self.backend.add_txn_offsets(rows)
            pending = self.pending.setdefault(tid, {})
            for r in rows:
                pending[(r.group_id, r.topic, r.partition)] = r

    async def end_txn(self, tid: str, producer_id: int, epoch: int, commit: bool) -> None:
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

    def check_write(self, tid: str, producer_id: int, epoch: int, topic: str, part: int) -> None:
        """A transactional produce: the producer must be the id's current one, with a
        transaction open that holds the partition (KIP-890 part 1)."""
        meta = self.txns.get(tid)
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
        meta = self.txns.get(tid)
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
        """Another coordinator changed the id's row: take its state as it now is."""
        row = await self.backend.load_txn(tid)
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
        """Markers into every partition of the prepared transaction, then Complete*."""
        commit = meta.state == TxnState.PREPARE_COMMIT
        futures = []
        for topic, partition in sorted(meta.partitions):
            try:
                futures.append(self.storage.append_marker(
                    topic, partition, meta.producer_id, meta.epoch, commit, COORDINATOR_EPOCH))
            except KafkaError as e:
                if e.code != ErrorCode.unknown_topic_or_partition:  # deleted: nothing to mark
                    raise
        if futures:
            _, late = await asyncio.wait(futures, timeout=MARKER_TIMEOUT_S)
            for f in late:
                f.add_done_callback(lambda x: x.exception())  # retrieved: nobody waits
            if late:
                raise KafkaError(ErrorCode.request_timed_out, "markers not durable in time")
            failed = [f.exception() for f in futures if f.exception() is not None]
            if failed:
                raise KafkaError(ErrorCode.kafka_storage_error, f"markers failed: {failed!r}")
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
        for r in moved:  # the committed offsets become what OffsetFetch answers
            self.offsets.offsets.setdefault(r.group_id, {})[(r.topic, r.partition)] = r
