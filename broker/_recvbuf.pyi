"""Types of broker/_recvbuf.c (see its header comment)."""

def uninitialized(n: int, /) -> bytearray:
    """A bytearray of `n` bytes whose content is undefined until written (ValueError if
    n < 0, MemoryError if it cannot be had)."""
