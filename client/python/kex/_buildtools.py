"""Build-time helpers shared by the build backend and the package: the gRPC
stubs of kex.proto (kex_pb2.py, kex_pb2_grpc.py) and the project's version.

Standalone on purpose (imports nothing of kex, grpc or numpy): the build
backend (_backend/kex_build.py) loads this file by path to put the stubs and
the version into the wheel; kex._client calls generate() on first import when
kex/_pb/ is missing, and kex.__version__ comes from meson_version() when kex
runs from the source tree.

The stubs are generated flat (-I <dir of kex.proto>) and their one import is
made package-relative, so they never clash with this package's own name `kex`.
grpc_tools is used in-process when importable; otherwise `python -m
grpc_tools.protoc` runs with the interpreter's own site-packages (a PEP 517
build under pip's build isolation hides them from the backend process).
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

STUBS = ("kex_pb2.py", "kex_pb2_grpc.py")


def meson_version(meson_build):
    """The `version` of the top-level meson.build's project('kex', ...) call: the one
    source of the project's version.  Raises ValueError when it is not there."""
    with open(meson_build, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"""project\s*\(\s*'kex'(.*?)\)\s*$""", text, re.S | re.M)
    v = m and re.search(r"""\bversion\s*:\s*'([^']+)'""", m.group(1))
    if not v:
        raise ValueError(f"{meson_build}: no project('kex', ..., version : '...')")
    return v.group(1)


def _protoc_in_process(proto, out):
    """True when grpc_tools ran here (raises RuntimeError when it ran and failed), False when not importable."""
    try:
        from grpc_tools import protoc
    except ImportError:
        return False
    rc = protoc.main(["grpc_tools.protoc", f"-I{os.path.dirname(proto)}", f"--python_out={out}",
                      f"--grpc_python_out={out}", os.path.basename(proto)])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc exited with {rc} on {proto}")
    return True


def _protoc_subprocess(proto, out, python):
    # drop what pip's build isolation sets, so `python` sees its own site-packages again
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    try:
        r = subprocess.run([python, "-m", "grpc_tools.protoc", f"-I{os.path.dirname(proto)}", f"--python_out={out}",
                            f"--grpc_python_out={out}", os.path.basename(proto)], env=env, capture_output=True,
                           text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"cannot run {python} -m grpc_tools.protoc: {e}") from None
    if r.returncode != 0:
        raise RuntimeError(f"{python} -m grpc_tools.protoc failed ({r.returncode}): {r.stderr.strip()[-500:]}")


def have_grpc_tools(python=None):
    """Whether `python` (default: this interpreter, in this process or else with its own
    site-packages) can import grpc_tools."""
    if python is None and importlib.util.find_spec("grpc_tools") is not None:
        return True
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    try:
        return subprocess.run([python or sys.executable, "-c", "import grpc_tools.protoc"], env=env,
                              capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def generate_files(proto, python=None):
    """The stubs of `proto` as {file name: bytes} (kex_pb2.py, kex_pb2_grpc.py, __init__.py).

    Raises RuntimeError saying why when grpc_tools is nowhere to be found or fails.
    """
    proto = os.path.abspath(proto)
    if not os.path.isfile(proto):
        raise RuntimeError(f"{proto} does not exist")
    with tempfile.TemporaryDirectory(prefix="kex-stubs-") as tmp:
        if not _protoc_in_process(proto, tmp):
            _protoc_subprocess(proto, tmp, python or sys.executable)
        files = {}
        for name in STUBS:
            path = os.path.join(tmp, name)
            if not os.path.exists(path):
                raise RuntimeError(f"grpc_tools.protoc did not write {name}")
            with open(path, "rb") as f:
                files[name] = f.read()
    files["kex_pb2_grpc.py"] = re.sub(rb"(?m)^import kex_pb2 as", b"from . import kex_pb2 as", files["kex_pb2_grpc.py"])
    files["__init__.py"] = b""
    return files


def generate(proto, out_dir, python=None):
    """Write the stubs of `proto` into out_dir (created if needed).

    Each file is written to a temporary name and renamed into place, kex_pb2_grpc.py
    (the file whose presence means "stubs exist") last, so a concurrent importer
    never sees half a set.
    """
    files = generate_files(proto, python)
    os.makedirs(out_dir, exist_ok=True)
    for name in ("__init__.py", "kex_pb2.py", "kex_pb2_grpc.py"):
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(files[name])
            os.chmod(tmp, 0o644)
            os.replace(tmp, os.path.join(out_dir, name))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
