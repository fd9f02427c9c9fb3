"""ports.py - a free 127.0.0.1 TCP port, for the integration tests and the benchmarks that start kexd.

No dependencies, so the benchmarks (bench/*.py) import it as well as kexdtest.py.
"""
import socket


def free_port():
    """A port nothing listens on now (the kernel's pick); the caller binds it soon after."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
