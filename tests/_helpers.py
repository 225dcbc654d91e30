"""Small helpers more than one test file needs (the ZeRO equivalence set-up is zero_cases.py)."""
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
