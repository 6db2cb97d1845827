"""Install hook: build the Q4_1 multi-row kernels for llama.cpp (adaspark_app/native/build.py),
and with CUDA (CMAKE_ARGS turning GGML_CUDA on) its batch-invariant CUDA library.

Everything else is in pyproject.toml. A failed kernel build does not fail the install: AdaSpark
then runs on llama-cpp-python's stock libraries (and says so in `adaspark bench` reports).
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithKernels(build_py):
    def run(self):
        super().run()
        spec = importlib.util.spec_from_file_location("_adaspark_native_build", ROOT / "adaspark_app" / "native" / "build.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        try:
            path = mod.build(say=lambda m: print(m, file=sys.stderr, flush=True))
            cuda = ", and the batch-invariant CUDA library" if mod.built_cuda() else ""
            print(f"adaspark: Q4_1 kernels ({', '.join(mod.built_variants())}){cuda} in {path}", file=sys.stderr)
            if not getattr(self, "editable_mode", False):  # a wheel: ship the libraries (one per variant) in it
                dest = Path(self.build_lib) / "adaspark_app" / "native" / "lib"
                for f in path.rglob("*"):
                    if f.is_file() and f.name != "build.log":
                        (dest / f.relative_to(path)).parent.mkdir(parents=True, exist_ok=True)
                        (dest / f.relative_to(path)).write_bytes(f.read_bytes())
        except Exception as e:  # noqa: BLE001 - any failure leaves the stock kernels
            print(f"adaspark: WARNING: Q4_1 kernels not built ({e}); the stock llama.cpp kernels will be used",
                  file=sys.stderr)


setup(cmdclass={"build_py": BuildWithKernels})
