"""Installed with the kex wheel as the top-level module `_kex_autoload` (and a .pth file that imports it at
interpreter start): when a program imports tinygrad, kex.tinygrad is installed right after, so a tinygrad
program runs on kexd with no change of its own -- `KEX=1 python3 prog.py`, or `device="KEX"` in it.

Standard library only, and nothing happens until tinygrad itself is imported; KEX_TINYGRAD=0 turns it off.
"""
import importlib.abc
import importlib.util
import os
import sys
import warnings


class _AfterTinygrad(importlib.abc.MetaPathFinder):
    """Finds tinygrad as the other finders do, and installs kex.tinygrad once tinygrad's __init__ ran."""

    def find_spec(self, name, path=None, target=None):
        if name != "tinygrad":
            return None
        sys.meta_path.remove(self)   # once: the real finders find tinygrad
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                import kex.tinygrad  # noqa: F401  (registers the device KEX, honours KEX=1 and KEX_SERVER)
            except Exception as e:  # noqa: BLE001 - tinygrad works on without KEX
                warnings.warn(f"kex: device KEX not registered with tinygrad ({e})", RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_module
        return spec


def enable():
    """Install the hook (idempotent; nothing when KEX_TINYGRAD=0 or tinygrad is imported already)."""
    if os.environ.get("KEX_TINYGRAD") == "0":
        return
    if "tinygrad" in sys.modules:
        if "kex.tinygrad" not in sys.modules:
            try:
                import kex.tinygrad  # noqa: F401
            except Exception:  # noqa: BLE001
                pass
        return
    if not any(type(f).__name__ == "_AfterTinygrad" for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTinygrad())


if __name__ == "_kex_autoload":
    enable()
