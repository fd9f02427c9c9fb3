"""kex_build - the in-tree PEP 517 / PEP 660 build backend of the kex Python package.

pyproject.toml names it with `backend-path = ["_backend"]` and `requires = []`,
so pip needs nothing from an index to build kex: this file uses the standard
library only (plus tomli on Pythons before 3.11, and grpcio-tools where the
building python has no grpc_tools, both asked for through
get_requires_for_build_*).  `pip install --no-index ./client/python` works on
a machine without network, in a venv made with --system-site-packages that
sees Debian's python3-grpcio, python3-protobuf and python3-numpy.

What it builds:
  wheel     kex/*.py; kex/_pb/ (the gRPC stubs, generated now from
            proto/kex/v1/kex.proto with grpc_tools when the building python
            has it -- under pip's build isolation through a subprocess of the
            same interpreter with its own site-packages); kex/_proto/kex.proto
            (so an installed kex without stubs can still make them on first
            import); kex/_version.py; the .dist-info.
  editable  a .pth that maps `import kex` to this source folder (only the kex
            package: nothing else of client/python lands on sys.path); the stubs
            are made in the folder's kex/_pb/ now or on first import.
  sdist     the package sources, this backend, kex/_proto/kex.proto and PKG-INFO.

The version is the top-level meson.build's project(version:) -- the one
source of the project's version -- or an sdist's PKG-INFO.
"""
import base64
import hashlib
import importlib.util
import io
import os
import re
import sys
import tarfile
import time
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # client/python (or an unpacked sdist)
REPO = os.path.dirname(os.path.dirname(HERE))                         # the kex repository, when HERE is in one
TREE_PROTO = os.path.join(REPO, "proto", "kex", "v1", "kex.proto")
PKG_PROTO = os.path.join(HERE, "kex", "_proto", "kex.proto")          # the copy an sdist carries
TAG = "py3-none-any"


def _buildtools():
    spec = importlib.util.spec_from_file_location("_kex_buildtools", os.path.join(HERE, "kex", "_buildtools.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _log(msg):
    print(f"kex_build: {msg}", file=sys.stderr)


# ---- metadata ----

def _pyproject():
    try:
        import tomllib
    except ImportError:  # Python < 3.11: get_requires_for_build_* asked for tomli
        import tomli as tomllib
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _in_repo():
    return os.path.isfile(TREE_PROTO) and os.path.isfile(os.path.join(REPO, "meson.build"))


def _version():
    pkg_info = os.path.join(HERE, "PKG-INFO")
    if os.path.isfile(pkg_info):  # an sdist
        with open(pkg_info, encoding="utf-8") as f:
            m = re.search(r"(?m)^Version: (\S+)$", f.read())
        if m:
            return m.group(1)
    if _in_repo():
        return _buildtools().meson_version(os.path.join(REPO, "meson.build"))
    raise RuntimeError(f"kex_build: no version: {HERE} is neither in the kex repository (meson.build) nor an sdist")


def _proto():
    if _in_repo():
        return TREE_PROTO
    if os.path.isfile(PKG_PROTO):
        return PKG_PROTO
    raise RuntimeError(f"kex_build: kex.proto is neither at {TREE_PROTO} nor at {PKG_PROTO}")


def _metadata(version):
    p = _pyproject()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {version}", f"Summary: {p['description']}"]
    lic = p.get("license", {})
    if isinstance(lic, dict) and "text" in lic:
        lines.append(f"License: {lic['text']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in p.get("dependencies", [])]
    for extra, deps in p.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    body = ""
    readme = p.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(HERE, readme), encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode()


def _wheel_file():
    return f"Wheel-Version: 1.0\nGenerator: kex_build\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode()


def _dist_info(version):
    return f"kex-{version}.dist-info"


# ---- the package's files ----

def _sources():
    """{archive path: bytes} of kex/**/*.py (not the generated kex/_pb/ or kex/_version.py)."""
    out = {}
    root = os.path.join(HERE, "kex")
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, HERE).replace(os.sep, "/")
        dirs[:] = sorted(x for x in dirs if x not in ("__pycache__", "_pb"))
        for name in sorted(files):
            if name.endswith(".py") and not (rel == "kex" and name == "_version.py"):
                with open(os.path.join(d, name), "rb") as f:
                    out[f"{rel}/{name}"] = f.read()
    return out


def _stubs():
    """{archive path: bytes} of kex/_pb/, or {} when grpc_tools is not to be had (kex makes them on first import)."""
    try:
        files = _buildtools().generate_files(_proto())
    except RuntimeError as e:
        _log(f"no gRPC stubs in the wheel ({e}); kex will generate them on first import")
        return {}
    return {f"kex/_pb/{name}": data for name, data in files.items()}


def _proto_copy():
    with open(_proto(), "rb") as f:
        return {"kex/_proto/kex.proto": f.read()}


# ---- wheels ----

def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _write_wheel(directory, version, files):
    """A wheel of {archive path: bytes} plus the .dist-info; its file name."""
    di = _dist_info(version)
    files = dict(files)
    files[f"{di}/METADATA"] = _metadata(version)
    files[f"{di}/WHEEL"] = _wheel_file()
    files[f"{di}/top_level.txt"] = b"kex\n"
    record = [_record_line(p, d) for p, d in files.items()] + [f"{di}/RECORD,,"]
    files[f"{di}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"kex-{version}-{TAG}.whl"
    when = time.localtime(max(time.time(), 315532800))[:6]  # zip timestamps start in 1980
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, when)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return name


def _tomli_if_needed():
    return [] if sys.version_info >= (3, 11) else ["tomli>=1.1"]


def _grpc_tools_if_needed():
    """[] when this python (or, under build isolation, the interpreter's own site-packages, as
    Debian's python3-grpc-tools) has grpc_tools, else ask pip for grpcio-tools to make the stubs."""
    return [] if _buildtools().have_grpc_tools() else ["grpcio-tools"]


def get_requires_for_build_wheel(config_settings=None):
    return _tomli_if_needed() + _grpc_tools_if_needed()


def get_requires_for_build_editable(config_settings=None):
    return _tomli_if_needed() + _grpc_tools_if_needed()


def get_requires_for_build_sdist(config_settings=None):
    return _tomli_if_needed()


def _prepare_metadata(directory):
    version = _version()
    di = _dist_info(version)
    os.makedirs(os.path.join(directory, di), exist_ok=True)
    for name, data in (("METADATA", _metadata(version)), ("WHEEL", _wheel_file()), ("top_level.txt", b"kex\n")):
        with open(os.path.join(directory, di, name), "wb") as f:
            f.write(data)
    return di


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _prepare_metadata(metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _prepare_metadata(metadata_directory)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    files = _sources()
    files.update(_stubs())
    files.update(_proto_copy())
    files["kex/_version.py"] = (f'"""Written by the build backend from meson.build: the project\'s version."""\n'
                                f'version = "{version}"\n').encode()
    files.update(_autoload())
    return _write_wheel(wheel_directory, version, files)


def _autoload():
    """The top-level module _kex_autoload (kex/_autoload.py) and the .pth that imports it at start: a program that
    imports tinygrad gets the device KEX without importing kex (kex/_autoload.py says how)."""
    with open(os.path.join(HERE, "kex", "_autoload.py"), "rb") as f:
        return {"_kex_autoload.py": f.read(), "kex-tinygrad.pth": b"import _kex_autoload\n"}


_FINDER = '''"""Installed by `pip install -e`: `import kex` loads the kex package of the source folder {root!r}."""
import importlib.abc
import importlib.util
import os
import sys

ROOT = {root!r}


class _KexEditableFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "kex":
            return None
        init = os.path.join(ROOT, "kex", "__init__.py")
        if not os.path.exists(init):
            return None
        return importlib.util.spec_from_file_location("kex", init, submodule_search_locations=[os.path.dirname(init)])


if not any(isinstance(f, _KexEditableFinder) or type(f).__name__ == "_KexEditableFinder" for f in sys.meta_path):
    sys.meta_path.append(_KexEditableFinder())
'''


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    try:  # the stubs in the source folder now, so the first import need not make them
        _buildtools().generate(_proto(), os.path.join(HERE, "kex", "_pb"))
    except (RuntimeError, OSError) as e:
        _log(f"gRPC stubs not generated now ({e}); kex will generate them on first import")
    files = {
        "__editable___kex_finder.py": _FINDER.format(root=HERE).encode(),
        f"__editable__.kex-{version}.pth": b"import __editable___kex_finder\n",
    }
    files.update(_autoload())
    return _write_wheel(wheel_directory, version, files)


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    base = f"kex-{version}"
    files = _sources()
    files.update(_proto_copy())
    for rel in ("pyproject.toml", "README.md", "_backend/kex_build.py"):
        with open(os.path.join(HERE, rel), "rb") as f:
            files[rel] = f.read()
    files["PKG-INFO"] = _metadata(version)
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{base}/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            t.addfile(info, io.BytesIO(data))
    return name
