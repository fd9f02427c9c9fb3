"""kexd_proc.py - a kexd of a test's (or a benchmark's) own: 127.0.0.1 on a free port, --metrics off, its own
cache file in a temporary folder, its output in a log there.  Used by conftest.py, the tests that need kexd
flags of their own, and bench/tinygrad_*.py.  (tests/integration/kexdtest.py is the integration scripts' own,
with the generated stubs they need.)"""
import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _die_with_parent():
    """In the child before exec: SIGTERM when the process that started it dies (a test or bench killed by a
    timeout must not leave a kexd compiling behind it)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def kexd_path():
    """$KEXD, else $KEX_BUILD_DIR/daemon/kexd (default build/)."""
    b = os.environ.get("KEX_BUILD_DIR", "build")
    return os.environ.get("KEXD") or os.path.join(b if os.path.isabs(b) else os.path.join(ROOT, b), "daemon", "kexd")


class Kexd:
    """`Kexd(*flags)`: a started kexd (.addr "127.0.0.1:PORT", .proc, .dir); .stop() (or `with`) ends it."""

    def __init__(self, *flags, kexd=None, timeout=10.0):
        self.dir = tempfile.TemporaryDirectory(prefix="kexd-")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        self.addr = f"127.0.0.1:{port}"
        self.log = os.path.join(self.dir.name, "kexd.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([kexd or kexd_path(), "--listen", self.addr, "--grace", "1", "--metrics", "off",
                                          "--cache", os.path.join(self.dir.name, "cache.db"), *flags],
                                         stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        end = time.time() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.time() > end:
                    self.stop()
                    raise RuntimeError(f"kexd did not start listening on {self.addr} (log: {self.log})")
                time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.dir.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
