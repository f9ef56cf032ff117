"""A null broker: the ceiling of floe's protocol path, with no storage at all.

    python -m benchmarks.nullbroker [--listen 127.0.0.1:0]

A uvloop `asyncio.Protocol` that frames requests, decodes each with floe's codec
(`broker.protocol.codec`, i.e. kio), and answers ApiVersions, Metadata, CreateTopics and
Produce at once, without storing anything: a produce is acknowledged with made-up offsets
(counted with floe's batch header reader). Fetch is advertised (librdkafka only uses the v2
record format with a broker that lists Fetch v4+) and answered with no data.
Prints `listening on HOST:PORT` like the broker.
Topics exist once created, or on first Metadata with `--partitions` partitions.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import sys
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

from broker.protocol import records
from broker.protocol.codec import (
    ProtocolError,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    peek,
    response_type,
)

PRODUCE, FETCH, METADATA, API_VERSIONS, CREATE_TOPICS = 0, 1, 3, 18, 19
VERSIONS = {
    PRODUCE: (3, 11),
    FETCH: (4, 12),
    METADATA: (0, 12),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (2, 7),
}
NO_AUTH_OPS = -(2**31)
ZERO_MS = datetime.timedelta(0)
MAX_FRAME = 100 * 1024 * 1024


@cache
def _fields(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def build(cls: Any, **values: Any) -> Any:
    """An instance of a kio schema class with the fields its version has."""
    names = _fields(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


@cache
def nested(api_key: int, version: int, name: str) -> type[Any]:
    module = sys.modules[response_type(api_key, version).__module__]
    cls = getattr(module, name)
    assert isinstance(cls, type)
    return cls


class NullState:
    def __init__(self, host: str, port: int, default_partitions: int) -> None:
        self.host, self.port = host, port
        self.default_partitions = default_partitions
        self.topics: dict[str, int] = {}
        self.next_offset: dict[tuple[str, int], int] = {}
        self.produced_bytes = 0

    def api_versions(self, version: int) -> Any:
        entry = nested(API_VERSIONS, version, "ApiVersion")
        keys = tuple(
            entry(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(VERSIONS.items())
        )
        return build(
            response_type(API_VERSIONS, version),
            error_code=ErrorCode.none,
            api_keys=keys,
            throttle_time=ZERO_MS,
        )

    def metadata(self, version: int, req: Any) -> Any:
        names = list(self.topics) if req.topics is None else [t.name for t in req.topics]
        part_cls = nested(METADATA, version, "MetadataResponsePartition")
        topic_cls = nested(METADATA, version, "MetadataResponseTopic")
        topics = []
        for name in names:
            if name is None:
                continue
            n = self.topics.setdefault(name, self.default_partitions)
            parts = tuple(
                build(
                    part_cls,
                    error_code=ErrorCode.none,
                    partition_index=i,
                    leader_id=0,
                    leader_epoch=0,
                    replica_nodes=(0,),
                    isr_nodes=(0,),
                    offline_replicas=(),
                )
                for i in range(n)
            )
            topics.append(
                build(
                    topic_cls,
                    error_code=ErrorCode.none,
                    name=name,
                    topic_id=_topic_id(name),
                    is_internal=False,
                    partitions=parts,
                    topic_authorized_operations=NO_AUTH_OPS,
                )
            )
        broker = build(
            nested(METADATA, version, "MetadataResponseBroker"),
            node_id=0,
            host=self.host,
            port=self.port,
            rack=None,
        )
        return build(
            response_type(METADATA, version),
            throttle_time=ZERO_MS,
            brokers=(broker,),
            cluster_id="null",
            controller_id=0,
            topics=tuple(topics),
            cluster_authorized_operations=NO_AUTH_OPS,
        )

    def create_topics(self, version: int, req: Any) -> Any:
        result_cls = nested(CREATE_TOPICS, version, "CreatableTopicResult")
        results = []
        for t in req.topics:
            n = t.num_partitions if t.num_partitions > 0 else self.default_partitions
            code = ErrorCode.topic_already_exists if t.name in self.topics else ErrorCode.none
            self.topics.setdefault(t.name, n)
            results.append(
                build(
                    result_cls,
                    name=t.name,
                    topic_id=_topic_id(t.name),
                    error_code=code,
                    error_message=None,
                    num_partitions=n,
                    replication_factor=1,
                    configs=None,
                )
            )
        return build(response_type(CREATE_TOPICS, version), throttle_time=ZERO_MS, topics=results)

    def produce(self, version: int, req: Any) -> Any:
        part_cls = nested(PRODUCE, version, "PartitionProduceResponse")
        topic_cls = nested(PRODUCE, version, "TopicProduceResponse")
        topics = []
        for td in req.topic_data:
            parts = []
            for pd in td.partition_data:
                data = pd.records or b""
                self.produced_bytes += len(data)
                count = sum(h.record_count for h in records.iter_headers(data))
                key = (td.name, pd.index)
                base = self.next_offset.get(key, 0)
                self.next_offset[key] = base + count
                parts.append(
                    build(
                        part_cls,
                        index=pd.index,
                        error_code=ErrorCode.none,
                        base_offset=base,
                        log_append_time=None,
                        log_start_offset=0,
                        record_errors=(),
                        error_message=None,
                    )
                )
            topics.append(build(topic_cls, name=td.name, partition_responses=tuple(parts)))
        return build(
            response_type(PRODUCE, version), responses=tuple(topics), throttle_time=ZERO_MS
        )

    def answer(self, frame: bytes) -> bytes | None:
        """The response frame for one request frame (None: acks=0 produce)."""
        api_key = peek(frame)[0]
        try:
            head, body = decode_request(frame, VERSIONS.get(api_key))
        except UnsupportedVersionError as e:
            if e.api_key != API_VERSIONS:
                raise
            resp = build(
                response_type(API_VERSIONS, 0),
                error_code=ErrorCode.unsupported_version,
                api_keys=(),
                throttle_time=ZERO_MS,
            )
            return encode_response(API_VERSIONS, 0, e.correlation_id, resp)
        v = head.api_version
        if api_key == PRODUCE:
            result = self.produce(v, body)
            if body.acks == 0:
                return None
        elif api_key == METADATA:
            result = self.metadata(v, body)
        elif api_key == FETCH:
            result = build(
                response_type(FETCH, v),
                throttle_time=ZERO_MS,
                error_code=ErrorCode.none,
                session_id=0,
                responses=(),
            )
        elif api_key == CREATE_TOPICS:
            result = self.create_topics(v, body)
        else:
            result = self.api_versions(v)
        return encode_response(api_key, v, head.correlation_id, result)


def _topic_id(name: str) -> Any:
    import uuid

    return uuid.uuid5(uuid.NAMESPACE_URL, f"null:{name}")


class NullConnection(asyncio.Protocol):
    def __init__(self, state: NullState) -> None:
        self.state = state
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport) or hasattr(transport, "write")
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        out = []
        while len(buf) - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
            if not 0 <= size <= MAX_FRAME:
                self._close()
                return
            if len(buf) - pos - 4 < size:
                break
            try:
                answer = self.state.answer(bytes(buf[pos + 4 : pos + 4 + size]))
            except ProtocolError:
                self._close()
                return
            if answer is not None:
                out.append(answer)
            pos += 4 + size
        if pos:
            del buf[:pos]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def serve(listen: str, partitions: int, stop: asyncio.Event | None = None) -> None:
    host, _, port = listen.rpartition(":")
    loop = asyncio.get_running_loop()
    state = NullState(host, int(port), partitions)
    server = await loop.create_server(lambda: NullConnection(state), host, int(port))
    state.host, state.port = server.sockets[0].getsockname()[:2]
    print(f"listening on {state.host}:{state.port}", flush=True)
    stop = stop or asyncio.Event()
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--partitions", type=int, default=16)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.run(serve(args.listen, args.partitions))
    except ImportError:
        asyncio.run(serve(args.listen, args.partitions))


if __name__ == "__main__":
    main()
