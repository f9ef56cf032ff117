"""What every request starts with, and the errors that cost a request its connection."""

from __future__ import annotations

from dataclasses import dataclass


class ProtocolError(Exception):
    """The frame cannot be understood; Kafka closes the connection."""


class UnsupportedVersionError(ProtocolError):
    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(f"api key {api_key} version {api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class RequestHead:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str = ""  # filled in by the network layer
