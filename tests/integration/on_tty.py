"""on_tty.py - run a program on a pseudo-terminal, as a person at a terminal would (test_cli.sh: kex top, kex tune).

run_on_tty(argv, keys, after, timeout) starts argv on a new pseudo-terminal, types `keys` once `after` seconds have
passed, and reads everything it prints until it closes the terminal; a program still running after `timeout`
seconds is killed.  Returns (its exit status, or -1 when it did not exit by itself; the bytes it printed).
"""
import os
import pty
import select
import signal
import time


def run_on_tty(argv, keys=b"", after=0.0, timeout=None):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(argv[0], argv)
    out, t0, sent = b"", time.time(), not keys
    while timeout is None or time.time() - t0 < timeout:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                d = os.read(fd, 65536)
            except OSError:
                break
            if not d:
                break
            out += d
        if not sent and time.time() - t0 > after:
            os.write(fd, keys)
            sent = True
    else:
        os.kill(pid, signal.SIGKILL)
    _, st = os.waitpid(pid, 0)
    return (os.WEXITSTATUS(st) if os.WIFEXITED(st) else -1), out
