"""The official Java client reads batches floe re-encoded for compression.type (its LZ4 and
snappy readers are the strictest about framing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.brokerproc import running_broker
from tests.integration.test_java_client import (
    CODECS,
    N_RECORDS,
    _failure_context,
    check_codec,
    parse_roundtrip,
    run_java,
)

pytestmark = [pytest.mark.integration, pytest.mark.java, pytest.mark.slow]


@pytest.mark.parametrize("stored", ["lz4", "snappy", "zstd", "gzip"])
def test_java_client_reads_recompressed_batches(tmp_path: Path, stored: str) -> None:
    """Must survive: with the broker default compression.type=STORED, batches the Java client
    produces with every codec are re-encoded as STORED and the Java consumer reads back every
    record, header, timestamp and acknowledged offset."""
    with running_broker(tmp_path / "d", "--set", f"compression.type={stored}") as broker:
        proc = run_java(broker, "roundtrip-all", str(N_RECORDS), "java-rc", *CODECS)
        out = parse_roundtrip(proc.stdout)
        failures = {}
        for codec in CODECS:
            try:
                check_codec(codec, out)
            except AssertionError as e:
                failures[codec] = str(e)
        assert not failures and proc.returncode == 0, (
            f"{failures}\n{_failure_context(proc, broker)}"
        )
