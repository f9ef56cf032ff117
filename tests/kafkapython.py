"""kafka-python in the tests: one known leak of the library closed before any test uses it.

kafka-python 3.0 (3.0.12, the newest release on 2026-11-23) opens a socket per connection
attempt in `kafka.net.inet.KafkaNetSocket.connect` and leaves it open when the connection is
refused: every attempt of a kafka-python client at a broker that is down (a stopped or SIGKILLed
broker still in its metadata, a reconnect after failover) leaks one socket. The garbage
collector finds it later, in whichever test happens to be running, and under the suite's
`filterwarnings = error` that unrelated test fails with "unclosed <socket.socket ...
laddr=('0.0.0.0', ...)>" (PytestUnraisableExceptionWarning). That is what failed 28 tests of a
CI run spread over a dozen files.

`close_refused_sockets()` wraps `KafkaNetSocket.sock_connect` (where the attempt fails) so that
the socket is closed when it raises: the client's behaviour is unchanged, only the leak goes.
The shim relies on that method's name and signature; when a kafka-python release no longer
has them it does nothing, and test_kafka_python_leaks_no_socket_on_a_refused_connection says
whether that release still leaks.
"""

from __future__ import annotations

import warnings
from typing import Any

_SCHEMA_WARNING = "(open|read)_text is deprecated"  # kafka-python loads its schemas so
_PATCHED = "_floe_closes_refused_sockets"


def close_refused_sockets() -> bool:
    """Install the shim (idempotent). False when kafka-python is absent or its layout changed."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _SCHEMA_WARNING, DeprecationWarning)
        try:
            from kafka.net.inet import KafkaNetSocket
        except ImportError:
            return False
    original = getattr(KafkaNetSocket, "sock_connect", None)
    if original is None:
        return False
    if getattr(original, _PATCHED, False):
        return True

    async def sock_connect(self: Any, net: Any, sock: Any, sockaddr: Any,
                           timeout_at: float | None = None) -> Any:
        try:
            return await original(self, net, sock, sockaddr, timeout_at=timeout_at)
        except BaseException:
            sock.close()
            raise

    setattr(sock_connect, _PATCHED, True)
    KafkaNetSocket.sock_connect = sock_connect
    return True
