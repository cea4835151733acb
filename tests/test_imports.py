"""Every module imports, and importing the package never imports the optional interop libraries
(nnsight, pyvene). Import cycles are a layout rule: tests/test_layout.py."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import tfmatcomp

ROOT = Path(tfmatcomp.__file__).parent


def test_every_module_imports():
    for info in pkgutil.walk_packages(tfmatcomp.__path__, "tfmatcomp."):
        importlib.import_module(info.name)


def test_no_module_imports_the_optional_interop_libraries():
    # A fresh interpreter: this test session may already have imported them (tests/test_interop_*).
    code = ("import importlib, pkgutil, sys, tfmatcomp\n"
            "for info in pkgutil.walk_packages(tfmatcomp.__path__, 'tfmatcomp.'):\n"
            "    importlib.import_module(info.name)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('nnsight', 'pyvene')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         cwd=ROOT.parent, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]", f"modules imported by importing tfmatcomp: {out}"
