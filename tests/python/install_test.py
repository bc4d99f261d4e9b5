#!/usr/bin/env python3
"""allocscope installed (meson test python_install, pytest through
tests/python/run_pytest.py): `meson install --no-rebuild --destdir` of the
build directory into a temporary directory, then, from that tree alone:

* the installed bin/allocscope runs Python with the installed shim
  (sitecustomize.py), the installed interposer and the installed
  allocscope package (allocscope, allocscope.torch, allocscope.pytest):
  not the source tree's, and without PYTHONPATH of our own;
* the package's dist-info carries the pytest11 entry point, which
  importlib.metadata sees once the staged site-packages is on sys.path,
  and pytest loads the plugin from it (no -p), also next to an explicit
  -p allocscope.pytest.

* the installed bin/allocscope-harness runs on the sim backend with the
  host-memory CUDA runtime installed for it alone (under
  <libdir>/allocscope/sim, found through the harness's relative runpath,
  with the driver it opens next to it), and the installed allocscope run
  records its two ranks and reports their layers and findings.

A destdir is not on the interpreter's path by itself: an install into
/usr/local would be (Debian's python3 reads /usr/local/lib/python3/
dist-packages), a staged one is not, so the entry point checks add it
with site.addsitedir as a .pth-reading site directory would be.

Environment (tests/meson.build): BUILD_ROOT, SOURCE_PYTHON_DIR.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

BUILD_ROOT = os.environ["BUILD_ROOT"]
SOURCE_PYTHON_DIR = os.path.realpath(os.environ["SOURCE_PYTHON_DIR"])
PY = sys.executable


def inside(path, directory):
    return os.path.realpath(path).startswith(os.path.realpath(directory) + os.sep)


def clean_env(**extra):
    env = dict(os.environ)
    for var in list(env):
        if var.startswith(("ALLOCSCOPE_", "PYTEST_")) or var in ("PYTHONPATH", "LD_PRELOAD",
                                                                 "PYTHONSTARTUP"):
            env.pop(var)
    # meson test puts the build tree's library directories on
    # LD_LIBRARY_PATH, ahead of any runpath: the installed tree must do
    # without them.
    kept = [d for d in env.pop("LD_LIBRARY_PATH", "").split(":")
            if d and not inside(d, BUILD_ROOT)]
    if kept:
        env["LD_LIBRARY_PATH"] = ":".join(kept)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def run(cmd, cwd, **env):
    return subprocess.run(cmd, cwd=cwd, env=clean_env(**env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=300)


class Staged:
    """The staged install: its root, bin/allocscope and the site-packages
    holding the allocscope package."""

    def __init__(self, root):
        self.root = root
        found = glob.glob(os.path.join(root, "**", "bin", "allocscope"), recursive=True)
        assert len(found) == 1, "bin/allocscope installed %d times: %r" % (len(found), found)
        self.cli = found[0]
        infos = glob.glob(os.path.join(root, "**", "allocscope-*.dist-info"), recursive=True)
        assert len(infos) == 1, "want one allocscope dist-info: %r" % infos
        self.site_packages = os.path.dirname(infos[0])
        self.dist_info = infos[0]
        harness = glob.glob(os.path.join(root, "**", "bin", "allocscope-harness"),
                            recursive=True)
        assert len(harness) == 1, "bin/allocscope-harness installed %d times" % len(harness)
        self.harness = harness[0]


@pytest.fixture(scope="module")
def staged():
    meson = shutil.which("meson")
    if meson is None:
        pytest.skip("no meson on PATH")
    root = tempfile.mkdtemp(prefix="allocscope-install-")
    try:
        p = run([meson, "install", "-C", BUILD_ROOT, "--no-rebuild", "--destdir", root], root)
        assert p.returncode == 0, "meson install failed:\n%s%s" % (p.stdout[-3000:], p.stderr)
        yield Staged(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# Under `allocscope run`: where the shim, the interposer and each module of
# the package came from.
WHERE_FROM = textwrap.dedent(
    """
    import importlib.util, os, sys
    shim = [f for f in sys.meta_path if type(f).__name__ == "_AllocscopeTorchFinder"]
    print("shim=" + (shim[0].find_spec.__code__.co_filename if shim else ""))
    try:
        import torch  # first, as a training script does
    except ImportError:
        torch = None
    import allocscope, allocscope.pytest
    if torch is not None:
        import allocscope.torch
    print("torch=" + ("yes" if torch is not None else "no"))
    print("interposer=" + str(allocscope.library_path()))
    for name in ("allocscope", "allocscope.torch", "allocscope.pytest"):
        print(name + "=" + os.path.realpath(importlib.util.find_spec(name).origin))
    """
)


def test_the_installed_allocscope_runs_python_with_the_installed_shim_and_package(staged):
    out = os.path.join(staged.root, "run-out")
    p = run([staged.cli, "run", "--out", out, "--plugins", "none", "--", PY, "-c", WHERE_FROM],
            staged.root)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "PyTorch hooks not installed" not in p.stderr, p.stderr
    seen = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    assert seen.get("shim", "").endswith(os.path.join("allocscope", "python", "sitecustomize.py"))
    assert inside(seen["shim"], staged.root), "the shim is not the installed one: %r" % seen
    assert inside(seen.get("interposer", ""), staged.root), "interposer: %r" % seen
    for name in ("allocscope", "allocscope.torch", "allocscope.pytest"):
        assert inside(seen.get(name, ""), staged.site_packages), (
            "%s comes from %r, not the installed site-packages %s" % (
                name, seen.get(name), staged.site_packages))
        assert not inside(seen[name], SOURCE_PYTHON_DIR), "%s from the source tree" % name


def test_the_installed_package_is_one_copy_the_shim_links_to(staged):
    shim_dir = glob.glob(os.path.join(staged.root, "**", "allocscope", "python"), recursive=True)
    assert len(shim_dir) == 1, shim_dir
    link = os.path.join(shim_dir[0], "allocscope")
    assert os.path.islink(link) and not os.path.isabs(os.readlink(link)), (
        "%s is not a relative link" % link)
    assert os.path.realpath(link) == os.path.realpath(
        os.path.join(staged.site_packages, "allocscope"))


ENTRY_POINT = textwrap.dedent(
    """
    import site, sys
    from importlib import metadata
    site.addsitedir(sys.argv[1])
    eps = metadata.entry_points()
    group = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    for ep in group:
        if ep.value == "allocscope.pytest":
            print("%s = %s from %s" % (ep.name, ep.value, ep.load().__file__))
    print("version = " + metadata.version("allocscope"))
    """
)


def test_the_pytest_entry_point_is_visible_from_the_installed_site_packages(staged):
    p = run([PY, "-c", ENTRY_POINT, staged.site_packages], staged.root)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    plugin = [l for l in lines if l.startswith("allocscope.pytest = allocscope.pytest from ")]
    assert len(plugin) == 1, p.stdout
    assert inside(plugin[0].rsplit(" from ", 1)[1], staged.site_packages), p.stdout
    version = staged.dist_info.rsplit("allocscope-", 1)[1][: -len(".dist-info")]
    assert "version = " + version in lines, p.stdout


MARKED = textwrap.dedent(
    """
    import ctypes

    import pytest

    import allocscope

    KEPT = []


    @pytest.mark.allocscope(plugins=["weight-copy-accumulation"])
    def test_keeps_a_weight_copy():
        allocscope.register_param("layers.0", "weight", 1 << 20, "bf16")
        with allocscope.scope("layers.0", "forward"):
            KEPT.append(ctypes.create_string_buffer(1 << 20))
            address = ctypes.addressof(KEPT[-1])
            allocscope.block_alloc(address, 1 << 20)
            allocscope.derived(address, "layers.0", "weight", "cast to fp8_e4m3")
    """
)

# pytest with the staged site-packages on sys.path, as an installed
# prefix on the interpreter's path would be.
PYTEST_WITH_SITE = "import site, sys; site.addsitedir(sys.argv[1]); import pytest; " \
                   "sys.exit(pytest.main(sys.argv[2:]))"


@pytest.mark.parametrize("explicit", [False, True], ids=["entry point", "entry point and -p"])
def test_pytest_loads_the_installed_plugin_from_its_entry_point(staged, explicit):
    work = tempfile.mkdtemp(dir=staged.root)
    with open(os.path.join(work, "marked_test.py"), "w") as f:
        f.write(MARKED)
    args = ["-p", "no:cacheprovider", "-rf"] + (["-p", "allocscope.pytest"] if explicit else [])
    p = run([staged.cli, "run", "--out", os.path.join(work, "out"), "--plugins", "none", "--",
             PY, "-c", PYTEST_WITH_SITE, staged.site_packages] + args + ["marked_test.py"], work)
    assert p.returncode == 1, "want the marked test to fail:\n" + p.stdout + p.stderr
    assert "1 failed" in p.stdout, p.stdout
    assert "weight-copy-accumulation [error] layers.0 (forward)" in p.stdout, p.stdout


def test_the_simulated_cuda_runtime_is_installed_for_the_harness_alone(staged):
    # A libcudart.so.13 anywhere on the loader's search path would shadow
    # the real CUDA runtime for every other program.
    runtimes = glob.glob(os.path.join(staged.root, "**", "libcudart.so*"), recursive=True)
    assert runtimes, "no simulated libcudart installed"
    for runtime in runtimes:
        assert os.path.basename(os.path.dirname(runtime)) == "sim" and \
            os.path.basename(os.path.dirname(os.path.dirname(runtime))) == "allocscope", (
                "%s is outside <libdir>/allocscope/sim" % runtime)
    # The loader resolves the harness's libcudart.so.13 to the staged one,
    # not to a real runtime the system has, and the driver it opens from its
    # own directory lies next to it (without ldd, not glibc, the run of the
    # next test is the only proof).
    ldd = shutil.which("ldd")
    if ldd is None:
        return
    p = run([ldd, staged.harness], staged.root)
    assert p.returncode == 0, p.stdout + p.stderr
    resolved = [l.split("=>", 1)[1].split("(", 1)[0].strip()
                for l in p.stdout.splitlines() if l.strip().startswith("libcudart.so.13 =>")]
    assert len(resolved) == 1 and inside(resolved[0], staged.root), p.stdout
    assert os.path.exists(os.path.join(os.path.dirname(resolved[0]), "libsimcuda.so"))


def test_the_installed_harness_runs_under_the_installed_allocscope_run(staged):
    harness = [staged.harness, "--backend", "sim", "--recipe", "delayed", "--te", "seed",
               "--layers", "2", "--steps", "2", "--warmup", "1"]
    alone = run(harness + ["--ranks", "1"], staged.root)
    assert alone.returncode == 0, alone.stdout + alone.stderr

    out = os.path.join(staged.root, "harness-out")
    p = run([staged.cli, "run", "--out", out, "--"] + harness + ["--ranks", "2"], staged.root)
    assert p.returncode == 0, p.stdout + p.stderr
    assert {"rank0.trace", "rank1.trace"} <= set(os.listdir(out)), os.listdir(out)
    assert "on 2 ranks" in p.stderr and "report: " in p.stderr, p.stderr
    with open(os.path.join(out, "report.txt")) as f:
        report = f.read()
    for layer in ("layers.0", "layers.1"):
        assert layer in report, report
    # The installed plugins judged what the installed interposer recorded.
    assert "weight-copy-accumulation" in report, report
