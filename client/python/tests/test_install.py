"""Installing the package, for real and offline: a fresh
`python3 -m venv --system-site-packages` venv, `pip install --no-index
./client/python` (the command client/README.md gives), then a script that
mixes numpy and kex runs with the venv's python against the session's kexd and
matches numpy's answers.  Also: `pip install --no-index -e`, a plain `pip
install` whose index is a dead port (nothing is downloaded, not even build
requirements), and kex.__version__ coming from meson.build alone.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kex

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PKG = os.path.join(ROOT, "client", "python")
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

# pip with no network: no index, no user config, no retries, no version check
PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "3", "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_NO_CACHE_DIR": "1"}


def meson_version():
    with open(os.path.join(ROOT, "meson.build")) as f:
        return re.search(r"project\(\s*'kex'.*?version\s*:\s*'([^']+)'", f.read(), re.S).group(1)


def run(cmd, cwd, env=None, timeout=300):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    e.update(PIP_ENV)
    e.update(env or {})
    r = subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("venv") / "V"
    r = subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", str(d)], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        pytest.fail(f"{PYTHON} -m venv failed (Debian: apt-get install python3-venv): {r.stderr[-2000:]}")
    return d


MIXING = textwrap.dedent("""\
    import json, sys
    import numpy as np
    import kex
    kex.connect(sys.argv[1])
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    t = kex.tensor(a)
    exprs = {
        "radd": np.ones(4, np.float32) + t,
        "rsub": b - t,
        "rmul": b * t * 2,
        "rdiv": np.float32(3) / (t * t + 1),
        "rmatmul": a.T @ t,
        "cmp": b < t,
        "softmax": (t + b).softmax(),
        "argmax": t.argmax(axis=1),
        "arange": kex.arange(6).reshape(2, 3) * np.array([1, 10, 100], np.int32),
        "eye": kex.eye(3) + np.full((3, 3), 0.5, np.float32),
        "list": kex.tensor([1, 2, 3]) * 4,
    }
    out = {k: {"is_tensor": isinstance(v, kex.Tensor), "value": np.asarray(v).tolist(),
               "dtype": str(np.asarray(v).dtype)} for k, v in exprs.items()}
    out["bool"] = bool(t.sum() < 0)
    out["float"] = float(t.max())
    out["version"] = kex.__version__
    out["file"] = kex.__file__
    out["job"] = kex.default_client().job
    print(json.dumps(out))
    """)


def expected():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    e = np.exp(a + b - (a + b).max(-1, keepdims=True))
    return {
        "radd": np.ones(4, np.float32) + a, "rsub": b - a, "rmul": b * a * 2, "rdiv": np.float32(3) / (a * a + 1),
        "rmatmul": a.T @ a, "cmp": b < a, "softmax": e / e.sum(-1, keepdims=True), "argmax": a.argmax(1),
        "arange": np.arange(6).reshape(2, 3) * np.array([1, 10, 100]), "eye": np.eye(3) + 0.5,
        "list": np.array([4, 8, 12]),
    }, bool(a.sum() < 0), float(a.max())


def check_mixing(venv, kexd_addr, tmp_path, site):
    script = tmp_path / "mix.py"
    script.write_text(MIXING)
    out = json.loads(run([str(venv / "bin" / "python"), str(script), kexd_addr], cwd=tmp_path))
    want, want_bool, want_float = expected()
    for k, w in want.items():
        assert out[k]["is_tensor"], f"{k}: numpy did not defer to the Tensor"
        np.testing.assert_allclose(np.array(out[k]["value"], dtype=np.float64), w.astype(np.float64),
                                   rtol=1e-5, atol=1e-5, err_msg=k)
    assert out["argmax"]["dtype"] == "int32" and out["list"]["dtype"] == "int32"
    assert out["bool"] == want_bool and out["float"] == pytest.approx(want_float)
    assert out["version"] == meson_version()
    assert out["file"].startswith(str(site)), out["file"]
    c = kex.Client(kexd_addr, job=out["job"])             # the script's job closed when it ended
    with pytest.raises(kex.Error):
        c.stats()
    c.close()
    return out


def test_pip_install_offline(venv, kexd_addr, tmp_path, needs_submit):
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    run(pip + ["install", "--no-index", "./client/python"], cwd=ROOT)
    site = run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               cwd=tmp_path).strip()
    assert os.path.isfile(os.path.join(site, "kex", "_pb", "kex_pb2_grpc.py")), "the wheel has no gRPC stubs"
    meta = run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('kex'))"],
               cwd=tmp_path).strip()
    assert meta == meson_version()
    check_mixing(venv, kexd_addr, tmp_path, site)

    # editable: `import kex` is the source folder's package (and nothing else of client/python)
    run(pip + ["uninstall", "-y", "kex"], cwd=ROOT)
    run(pip + ["install", "--no-index", "-e", "./client/python"], cwd=ROOT)
    check_mixing(venv, kexd_addr, tmp_path, os.path.join(PKG, "kex"))
    run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; assert u.find_spec('tests') is None"],
        cwd=tmp_path)

    # plain `pip install` (index on a dead port): builds and installs without asking any index
    run(pip + ["uninstall", "-y", "kex"], cwd=ROOT)
    run(pip + ["install", "./client/python"], cwd=ROOT)
    check_mixing(venv, kexd_addr, tmp_path, site)
    assert not os.path.exists(os.path.join(PKG, "build")), "the build left a build/ folder in the source tree"


def test_version_has_one_source(tmp_path):
    """kex.__version__ and the wheel's version are meson.build's: change it there and both follow."""
    assert kex.__version__ == meson_version()
    fake = tmp_path / "repo"
    shutil.copytree(PKG, fake / "client" / "python", ignore=shutil.ignore_patterns("__pycache__", "_pb", "tests"))
    shutil.copytree(os.path.join(ROOT, "proto"), fake / "proto")
    with open(os.path.join(ROOT, "meson.build")) as f:
        text = f.read()
    (fake / "meson.build").write_text(re.sub(r"(version\s*:\s*')[^']+'", r"\g<1>9.8.7'", text, count=1))
    pkg = fake / "client" / "python"
    got = run([PYTHON, "-c", "import kex; print(kex.__version__)"], cwd=tmp_path, env={"PYTHONPATH": str(pkg)})
    assert got.strip() == "9.8.7"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name = run([PYTHON, "-c", "import sys; sys.path.insert(0, '_backend'); import kex_build; "
                "print(kex_build.build_wheel(sys.argv[1]))", str(wheels)], cwd=pkg).strip()
    assert name == "kex-9.8.7-py3-none-any.whl"
    import zipfile
    with zipfile.ZipFile(wheels / name) as z:
        assert "Version: 9.8.7" in z.read("kex-9.8.7.dist-info/METADATA").decode()
        assert '"9.8.7"' in z.read("kex/_version.py").decode()
        assert "kex/_pb/kex_pb2.py" in z.namelist()


def test_wheel_offers_the_tinygrad_extra(tmp_path):
    """`pip install kex[tinygrad]`: the wheel carries kex/tinygrad.py and names tinygrad 0.9.0 as the extra's
    dependency (and only as the extra's: the plain install needs no tinygrad)."""
    import zipfile
    name = run([PYTHON, "-c", "import sys; sys.path.insert(0, '_backend'); import kex_build; "
                "print(kex_build.build_wheel(sys.argv[1]))", str(tmp_path)], cwd=PKG).strip()
    with zipfile.ZipFile(tmp_path / name) as z:
        meta = z.read(f"kex-{meson_version()}.dist-info/METADATA").decode().splitlines()
        assert "kex/tinygrad.py" in z.namelist()
    assert "Provides-Extra: tinygrad" in meta
    assert 'Requires-Dist: tinygrad==0.9.0; extra == "tinygrad"' in meta
    assert not any(m.startswith("Requires-Dist: tinygrad") and "extra" not in m for m in meta)


UNCHANGED = textwrap.dedent("""\
    import sys
    from tinygrad import Device, Tensor   # no `import kex` anywhere: the installed kex registers KEX
    assert Device.DEFAULT == "KEX", Device.DEFAULT
    t = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (t * t).sum().backward()
    print(t.grad.tolist(), (t * 2).sum().item(), sys.modules["kex.tinygrad"].stats()["submits"] > 0)
    """)


def test_installed_kex_runs_an_unchanged_tinygrad_program(venv, kexd_addr, tmp_path):
    """After `pip install kex`, a tinygrad program that imports only tinygrad runs on kexd with KEX=1."""
    tinygrad = os.path.normpath(os.path.join(ROOT, "..", "shared", "anchors", "tinygrad-0.9.0"))
    if not os.path.isdir(os.path.join(tinygrad, "tinygrad")):
        pytest.skip(f"tinygrad 0.9.0 is not at {tinygrad}")
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    run(pip + ["install", "--no-index", "./client/python"], cwd=ROOT)
    script = tmp_path / "prog.py"
    script.write_text(UNCHANGED)
    env = {"PYTHONPATH": tinygrad, "KEX": "1", "KEX_SERVER": kexd_addr}
    out = run([str(venv / "bin" / "python"), str(script)], cwd=tmp_path, env=env).split()
    assert " ".join(out) == "[2.0, 4.0, 6.0] 12.0 True", out
    off = run([str(venv / "bin" / "python"), "-c", "import tinygrad, sys; print('kex.tinygrad' in sys.modules)"],
              cwd=tmp_path, env={"PYTHONPATH": tinygrad, "KEX_TINYGRAD": "0"})
    assert off.strip() == "False"
