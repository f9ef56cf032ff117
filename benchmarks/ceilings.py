"""Ceilings measured in-process, on the same machine, right after the broker runs:

- raw object-store PUT and GET of the bytes a floe broker wrote (its own objects, same sizes,
  sequentially, as its WAL flusher does), through `s3stream.objectstore.open_object_store`
  on the same local directory or the same moto server;
- the latency of sequential PUTs of the median WAL object a fixed-rate workload wrote, on the
  same store (`put_latency`: the bound of issue 17's S3 fixed-rate target);
- raw `pyarrow.parquet.write_table` of the rows a table topic holds (zstd, pyiceberg's
  default codec), next to `tabletopic.convert.Converter` on the same records.
"""

from __future__ import annotations

import asyncio
import io
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.client import _json_value

REPEATS = 3


@dataclass(frozen=True)
class RawStore:
    put_mib_s: float
    get_mib_s: float
    objects: int  # read back
    bytes: int
    put_objects: int
    median_put_bytes: int
    error: str = ""


async def _raw_store(url: str, put_sizes: list[int], budget_s: float, max_bytes: int) -> RawStore:
    from s3stream.objectstore import open_object_store

    store = open_object_store(url)
    try:
        keys = [k for k in await store.list("") if not k.startswith("bench-raw/")]
        blobs: list[bytes] = []
        total = 0
        t0 = time.perf_counter()
        for key in keys:
            if total >= max_bytes or time.perf_counter() - t0 > budget_s:
                break
            blob = await store.get(key)
            blobs.append(blob)
            total += len(blob)
        get_s = time.perf_counter() - t0
        if not blobs:
            return RawStore(0, 0, 0, 0, 0, 0, error="the broker wrote no objects")
        # PUT the broker's own bytes, cut into the sizes its WAL flusher wrote
        source = memoryview(b"".join(blobs))
        sizes = put_sizes or [len(b) for b in blobs]
        t0 = time.perf_counter()
        put_bytes = pos = 0
        written = []
        for i, size in enumerate(sizes):
            if time.perf_counter() - t0 > budget_s or put_bytes >= max_bytes:
                break
            if pos + size > len(source):
                pos = 0
            key = f"bench-raw/{i:08d}"
            await store.put(key, source[pos : pos + size])
            pos += size
            written.append(size)
            put_bytes += size
        put_s = time.perf_counter() - t0
        for i in range(len(written)):
            await store.delete(f"bench-raw/{i:08d}")
        return RawStore(
            put_mib_s=put_bytes / put_s / 2**20,
            get_mib_s=total / get_s / 2**20,
            objects=len(blobs),
            bytes=total,
            put_objects=len(written),
            median_put_bytes=sorted(written)[len(written) // 2],
        )
    finally:
        await store.close()


def raw_object_store(
    url: str, put_sizes: list[int], budget_s: float = 10.0, max_bytes: int = 1 << 30
) -> RawStore:
    """Sequential GET of the broker's objects, then sequential PUT of the same bytes in the
    sizes its WAL flusher wrote (`put_sizes`; all objects' sizes if empty)."""
    try:
        return asyncio.run(_raw_store(url, put_sizes, budget_s, max_bytes))
    except Exception as e:  # report, do not abort the whole run
        return RawStore(0, 0, 0, 0, 0, 0, error=f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class PutLatency:
    size: int
    puts: int
    p50_ms: float
    p99_ms: float
    error: str = ""


PUT_LATENCY_COUNT = 200


async def _put_latency(url: str, size: int, count: int) -> PutLatency:
    from s3stream.objectstore import open_object_store, put_parts

    store = open_object_store(url)
    try:
        blob = os.urandom(size)
        took = []
        for i in range(count):
            t0 = time.perf_counter()
            await put_parts(store, f"bench-raw-latency/{i:08d}", [blob])  # the WAL's PUT
            took.append((time.perf_counter() - t0) * 1000)
        for i in range(count):
            await store.delete(f"bench-raw-latency/{i:08d}")
        took.sort()
        return PutLatency(size, count, _pick(took, 50), _pick(took, 99))
    finally:
        await store.close()


def _pick(sorted_ms: list[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, math.ceil(q / 100 * len(sorted_ms)) - 1)]


def put_latency(url: str, size: int, count: int = PUT_LATENCY_COUNT) -> PutLatency:
    """Latency of `count` sequential PUTs of `size` bytes (the WAL's own PUT, one at a time,
    nothing else running): the object store's share of a produce latency."""
    try:
        return asyncio.run(_put_latency(url, size, count))
    except Exception as e:  # report, do not abort the whole run
        return PutLatency(size, 0, 0, 0, error=f"{type(e).__name__}: {e}")


@dataclass(frozen=True)
class Conversion:
    rows: int
    input_mib: float
    decode_rows_s: float  # record batches -> columns (tabletopic.columnar: the Python path)
    convert_rows_s: float  # columns -> Arrow (Converter.convert_columns, JSON values: Python)
    # record batches -> Arrow in C without the GIL (Converter.convert_batches: the path the
    # table writer takes for a read of flat JSON objects)
    native_rows_s: float
    parquet_rows_s: float  # pyarrow.parquet.write_table of the converted rows, zstd
    parquet_mib_s: float  # input (JSON value) MiB per second of the Parquet write
    convert_and_write_rows_s: float  # the C path's conversion, then the Parquet write


def conversion(rows: int, size: int) -> Conversion:
    import pyarrow.parquet as pq

    from broker.protocol import records as batches
    from broker.protocol.recordcodec import encode_batch
    from tabletopic.columnar import decode_columns
    from tabletopic.convert import Converter

    values = [_json_value(i, size) for i in range(rows)]
    key = (0).to_bytes(8, "big")
    blobs = [
        encode_batch([(key, v, []) for v in values[i : i + 1000]]) for i in range(0, rows, 1000)
    ]
    log = b"".join(blobs)
    decode_s = convert_s = native_s = write_s = math.inf
    table = None
    for _ in range(REPEATS):  # best of a few: the runs are short
        converter = Converter("json")  # as a table writer's, after its first read
        converter.convert_columns(0, decode_columns(blobs[0], batches.iter_headers(blobs[0]), 0))
        t0 = time.perf_counter()
        cols = decode_columns(log, batches.iter_headers(log), 0)  # one read of every batch
        decode_s = min(decode_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        table, invalid = converter.convert_columns(0, cols)
        convert_s = min(convert_s, time.perf_counter() - t0)
        assert table is not None and not invalid, invalid[:1]
        t0 = time.perf_counter()
        native = converter.convert_batches(0, log, batches.iter_headers(log), 0)
        native_s = min(native_s, time.perf_counter() - t0)
        assert native is not None and native.equals(table)
        t0 = time.perf_counter()
        pq.write_table(table, io.BytesIO(), compression="zstd")
        write_s = min(write_s, time.perf_counter() - t0)
    in_mib = sum(len(v) for v in values) / 2**20
    return Conversion(
        rows=rows,
        input_mib=in_mib,
        decode_rows_s=rows / decode_s,
        convert_rows_s=rows / convert_s,
        native_rows_s=rows / native_s,
        parquet_rows_s=rows / write_s,
        parquet_mib_s=in_mib / write_s,
        convert_and_write_rows_s=rows / (native_s + write_s),
    )


def summary(x: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(x).items()}
