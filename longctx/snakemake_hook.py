"""Snakemake's YAML errors with their file, line and column.

Snakemake reads every `--configfile` itself, before it reads our Snakefile, and replaces a YAML
syntax error with "Config file is not valid JSON or YAML" (snakemake.common.configfile, 9.x): no
file, no line, nothing the Snakefile could add afterwards. `make setup` puts a .pth file in the
virtual environment (`python -m longctx.snakemake_hook --install`) that imports this module at
every start of its Python; it does nothing until Snakemake imports its config-file reader, and then
wraps that reader so that the same error names the file, the line and the column, as
`longctx check-config` does. Where Snakemake's reader is no longer shaped so (another version), the
wrapper stands aside and Snakemake's own message is left as it is.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import sysconfig
from pathlib import Path

TARGET = "snakemake.common.configfile"
PTH_NAME = "longctx-snakemake.pth"
PTH_LINE = ("import importlib.util; importlib.util.find_spec('longctx') is not None "
            "and __import__('longctx.snakemake_hook').snakemake_hook.install()\n")


def _with_marks(load):
    @functools.wraps(load)
    def wrapped(configpath_or_obj, *args, **kwargs):
        try:
            return load(configpath_or_obj, *args, **kwargs)
        except Exception as error:
            cause = error.__context__
            if type(error).__name__ != "WorkflowError" or cause is None or type(cause).__module__.split(".")[0] != "yaml":
                raise
            from longctx.config import yaml_error_message

            path = configpath_or_obj if isinstance(configpath_or_obj, (str, Path)) else getattr(
                configpath_or_obj, "name", "(stream)")
            error.args = (yaml_error_message(path, cause),)  # the same error, raised where Snakemake raised it
            raise
    wrapped.longctx_wrapped = True
    return wrapped


def patch(module) -> bool:
    """Wrap `module._load_configfile` (Snakemake's reader); False where there is none to wrap."""
    load = getattr(module, "_load_configfile", None)
    if not callable(load) or getattr(load, "longctx_wrapped", False):
        return False
    module._load_configfile = _with_marks(load)
    return True


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Called by the .pth file at start-up: patch Snakemake's reader when (and if) it is imported."""
    if TARGET in sys.modules:
        patch(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def write_pth(site_packages: str | Path | None = None) -> Path:
    """Put the .pth file in this Python's site-packages (the virtual environment's)."""
    target = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text(PTH_LINE)
    return target


if __name__ == "__main__":
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: python -m longctx.snakemake_hook --install")
    print(f"wrote {write_pth()}")
