"""allocscope's sitecustomize: PyTorch tagging for an unchanged training script.

`allocscope run` prepends this directory to PYTHONPATH and sets
ALLOCSCOPE_PYTHON=1, so every Python process of the run imports this module
at startup (the `site` module imports the first `sitecustomize` on sys.path).

* Without ALLOCSCOPE_PYTHON=1 it does nothing of its own.
* It does not import torch: it puts a finder on sys.meta_path that waits for
  the program's own `import torch`, lets torch import completely, and then
  calls allocscope.torch.enable() (module, backward and optimizer hooks;
  the caching-allocator bridge once CUDA is initialized). A Python process
  that never imports torch pays for one list entry.
* Whatever it does, it then runs the sitecustomize this one shadows (the next
  one on sys.path, e.g. a distribution's or a virtualenv's), which becomes
  sys.modules["sitecustomize"].
"""

import os
import sys


def _allocscope_say(text):
    try:
        sys.stderr.write("allocscope: %s\n" % text)
    except Exception:
        pass


def _allocscope_torch_imported():
    try:
        shim = sys.modules.get("allocscope.torch")
        if shim is not None and not hasattr(shim, "enable"):
            # torch is being imported by allocscope.torch itself (the
            # program imported it first): it calls enable() once complete.
            shim._enable_when_imported = True
            return
        import allocscope.torch as _shim

        _shim.enable()
    except Exception as e:  # the program goes on untagged
        _allocscope_say("PyTorch hooks not installed: %s: %s" % (type(e).__name__, e))


class _AllocscopeLoader:
    """Runs the real loader of torch, then the allocscope setup."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self._inner.exec_module(module)
        # From here on nothing sees the wrapper.
        try:
            module.__loader__ = self._inner
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._inner
        except Exception:
            pass
        _allocscope_torch_imported()

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _AllocscopeTorchFinder:
    """A sys.meta_path entry that only watches for the top-level `torch`."""

    def __init__(self):
        self._busy = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        try:
            sys.meta_path.remove(self)  # one shot
        except ValueError:
            pass
        spec.loader = _AllocscopeLoader(spec.loader)
        return spec

    def invalidate_caches(self):
        pass


def _allocscope_install():
    # Read from the environment, not asked of liballocscope.so: this runs in
    # every Python process of the run, and one that never imports torch
    # loads nothing of allocscope (docs/ENVIRONMENT.md). The switch spellings
    # are core's (core/config.cpp, parse_switch).
    if os.environ.get("ALLOCSCOPE_PYTHON") not in ("1", "true", "yes"):
        return
    if "torch" in sys.modules:  # imported already (e.g. by a .pth file)
        _allocscope_torch_imported()
        return
    if not any(isinstance(f, _AllocscopeTorchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AllocscopeTorchFinder())


def _allocscope_chain():
    """Runs the next sitecustomize on sys.path (the one this file shadows)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    search = []
    for entry in sys.path:
        try:
            if os.path.abspath(entry or os.curdir) == here:
                continue
        except Exception:
            pass
        search.append(entry)
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", search)
    if spec is None or spec.loader is None:
        return
    if spec.origin and os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _allocscope_install()
except Exception as _e:
    _allocscope_say("Python shim not installed: %s" % _e)
_allocscope_chain()
