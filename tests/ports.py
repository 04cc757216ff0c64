"""A port for a server a test starts on 127.0.0.1."""

import socket


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice of an ephemeral one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
