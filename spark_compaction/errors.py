"""Errors from Spark (JVM exceptions through py4j) as one line of text."""

from __future__ import annotations


def error_text(e: BaseException) -> str:
    """An error in one line: for a JVM error its class and message, and its root cause."""
    java = getattr(e, "java_exception", None)
    if java is not None:
        try:
            top = str(java.toString())
            cur, root = java, java
            for _ in range(20):
                nxt = cur.getCause()
                if nxt is None:
                    break
                root = cur = nxt
            line = top.splitlines()[0].strip()
            if root is not java:
                line += f" (caused by {str(root.toString()).splitlines()[0].strip()})"
            return line[:1000]
        except Exception:
            pass
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    name = type(e).__name__
    return (f"{name}: {text}" if text and not text.startswith("[") else text or name)[:1000]
