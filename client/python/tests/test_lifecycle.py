"""A job a script opens is closed when the script ends -- normally, by
sys.exit, or by an uncaught exception -- and when its Client is
garbage-collected; a borrowed job (Client(addr, job=TOKEN)) is left open."""
import gc
import os
import subprocess
import sys
import textwrap

import grpc
import pytest

import kex

PKG = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def job_is_open(addr, token):
    c = kex.Client(addr, job=token)
    try:
        c.stats()
        return True
    except kex.Error as e:
        assert e.code == grpc.StatusCode.NOT_FOUND, e
        return False
    finally:
        c.close()


@pytest.mark.parametrize("ending,rc", [("pass", 0), ("sys.exit(3)", 3), ("raise RuntimeError('boom')", 1)])
def test_script_jobs_close_at_exit(kexd_addr, ending, rc):
    script = textwrap.dedent(f"""\
        import sys
        import numpy as np
        import kex
        kex.connect(sys.argv[1])
        other = kex.Client(sys.argv[1], name="second")       # not the default one: closed too
        print(kex.default_client().job, other.job, flush=True)
        assert (kex.tensor(np.ones(4, np.float32)) + 1).plan().kernels == 1   # the job is used
        {ending}
        """)
    r = subprocess.run([sys.executable, "-c", script, kexd_addr], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=PKG))
    assert r.returncode == rc, r.stderr
    tokens = r.stdout.split()
    assert len(tokens) == 2, r.stdout + r.stderr
    for t in tokens:
        assert not job_is_open(kexd_addr, t), f"job {t} is still open after the script ended"


def test_gc_and_close(kexd_addr):
    c = kex.Client(kexd_addr)
    token = c.job
    assert job_is_open(kexd_addr, token)
    del c
    gc.collect()
    assert not job_is_open(kexd_addr, token)
    with kex.Client(kexd_addr) as c:
        token = c.job
        assert not c.closed
    assert c.closed and not job_is_open(kexd_addr, token)
    c.close()                                            # idempotent


def test_borrowed_job_stays_open(kexd_addr):
    owner = kex.Client(kexd_addr)
    borrower = kex.Client(kexd_addr, job=owner.job)
    borrower.close()
    del borrower
    gc.collect()
    assert job_is_open(kexd_addr, owner.job)
    owner.close()
    assert not job_is_open(kexd_addr, owner.job)


def test_killed_script_leaves_nothing(kexd_addr):
    """A script killed with SIGKILL cannot close its job; the job it opened is held (HoldJob), so kexd
    closes it -- and frees its outputs -- as soon as the connection breaks, not when the lease ends."""
    script = textwrap.dedent("""\
        import sys, time
        import numpy as np
        import kex
        kex.connect(sys.argv[1])
        t = (kex.tensor(np.ones((256, 256), np.float32)) * 2).realize()   # an output held on the server
        print(kex.default_client().job, flush=True)
        time.sleep(600)
        """)
    p = subprocess.Popen([sys.executable, "-c", script, kexd_addr], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=PKG))
    try:
        token = p.stdout.readline().strip()
        assert token and job_is_open(kexd_addr, token)
    finally:
        p.kill()
        p.wait()
    import time
    for _ in range(50):
        if not job_is_open(kexd_addr, token):
            break
        time.sleep(0.1)
    assert not job_is_open(kexd_addr, token), "the killed script's job is still open"
