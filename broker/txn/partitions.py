"""The log side of transactions for the s3stream engine: writing markers through the same
durable append path as produced data (the WAL: acknowledged only once the marker's object and
its metadata commit are durable), and rebuilding each partition's open transactions and
aborted ranges from its log when the broker comes to serve it."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from broker.engine import AppendResult
from broker.errors import ErrorCode, KafkaError
from broker.protocol import records
from broker.txn.index import TxnIndex
from broker.txn.markers import ABORT, COMMIT, control_batch
from s3stream.log import LogStore, StreamFencedError, UnknownStreamError

SCAN_BYTES = 8 << 20  # read per step when rebuilding a partition's transactions


class TxnLog:
    def __init__(self, log: LogStore) -> None:
        self.log = log
        self.index = TxnIndex()

    def append_marker(
        self, stream_id: int, producer_id: int, epoch: int, commit: bool, coordinator_epoch: int
    ) -> asyncio.Future[AppendResult]:
        """Append a COMMIT or ABORT marker of the producer's transaction; the future resolves
        with its offset once durable, when the partition's transaction is closed (its LSO
        may move past it; an abort's range is served to read_committed fetches from then).
        A marker from a coordinator older than one that wrote a marker of the producer here
        raises TRANSACTION_COORDINATOR_FENCED (nothing is written)."""
        self.index.fence(stream_id, producer_id, coordinator_epoch)
        data = control_batch(producer_id, epoch, commit, coordinator_epoch)
        header = records.read_header(data)

        def encode(base: int) -> bytearray:
            buf = bytearray(data)
            records.assign_offsets(buf, [header], base, None)
            return buf

        stream = self.log.stream(stream_id)
        base, durable = self.log.append(stream_id, 1, header.max_timestamp, encode)
        result: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        kind = COMMIT if commit else ABORT

        def done(f: asyncio.Future[int]) -> None:
            exc = f.exception()
            if exc is None:
                if self.log.streams.get(stream_id) is stream:  # still served (not reloaded)
                    self.index.marker_durable(stream_id, producer_id, kind, base)
                result.set_result(AppendResult(base, -1))
            elif isinstance(exc, StreamFencedError | UnknownStreamError):
                result.set_exception(KafkaError(ErrorCode.not_leader_or_follower, str(exc)))
            else:
                result.set_exception(KafkaError(ErrorCode.kafka_storage_error, repr(exc)))

        durable.add_done_callback(done)
        return result

    async def rebuild(self, stream_ids: Collection[int]) -> None:
        """Read the transactional state of these partitions from their logs (whole chunks
        from the log start to the high watermark, SCAN_BYTES at a time)."""
        for sid in stream_ids:
            st = self.log.stream(sid)
            state = self.index.reset(sid)
            offset, end = st.start_offset, st.end_offset
            while offset < end:
                chunks = await self.log.read_chunks(sid, offset, SCAN_BYTES)
                if not chunks:
                    break
                for c in chunks:
                    state.scan(c.data, records.iter_headers(c.data))
                offset = chunks[-1].last_offset + 1

    def drop(self, stream_id: int) -> None:
        self.index.drop(stream_id)
