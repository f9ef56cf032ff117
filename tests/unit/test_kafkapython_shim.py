"""The suite's kafka-python shim (tests/kafkapython.py): a client trying a port where nothing
listens leaves no socket open, so no unrelated test later fails on its ResourceWarning."""

from __future__ import annotations

import gc
import socket
import time
import warnings

from tests.kafkapython import close_refused_sockets


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def test_kafka_python_leaks_no_socket_on_a_refused_connection() -> None:
    assert close_refused_sockets(), "kafka-python's KafkaNetSocket.sock_connect is gone: " \
        "check whether this release still leaks refused sockets (tests/kafkapython.py)"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(open|read)_text is deprecated", DeprecationWarning)
        from kafka import KafkaConsumer
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{closed_port()}",
                             api_version=(2, 5), reconnect_backoff_ms=20,
                             reconnect_backoff_max_ms=50)
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # several refused attempts
            consumer.poll(timeout_ms=100)
    finally:
        consumer.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaked == []
