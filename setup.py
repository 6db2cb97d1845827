"""Install hook: build the Q4_1 multi-row kernels for llama.cpp (adaspark_app/native/build.py),
and with CUDA (CMAKE_ARGS turning GGML_CUDA on) its batch-invariant CUDA library; the round's
pricing in C (adaspark_app/native/pricing.py) and the one-line crash handler
(adaspark_app/native/fatal_signal.py).

Everything else is in pyproject.toml. A failed kernel build does not fail the install: AdaSpark
then runs on llama-cpp-python's stock libraries (and says so in `adaspark bench` reports); nor
does a failed pricing build (the numpy code then runs, and the reports say so), nor the crash
handler's (a crash then ends the process by its signal).
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
        except Exception as e:  # noqa: BLE001 - any failure leaves the stock kernels
            print(f"adaspark: WARNING: Q4_1 kernels not built ({e}); the stock llama.cpp kernels will be used",
                  file=sys.stderr)
        self.build_small_c()
        if not getattr(self, "editable_mode", False):  # a wheel: ship what was built (kernels per variant, pricing)
            lib = mod.LIB_DIR
            dest = Path(self.build_lib) / "adaspark_app" / "native" / "lib"
            for f in lib.rglob("*") if lib.is_dir() else ():
                if f.is_file() and f.name not in ("build.log", "failed.txt"):
                    (dest / f.relative_to(lib)).parent.mkdir(parents=True, exist_ok=True)
                    (dest / f.relative_to(lib)).write_bytes(f.read_bytes())

    def build_small_c(self):
        """The round's pricing in C (adaspark_app/native/pricing.py; without it the numpy code
        runs) and the crash handler (adaspark_app/native/fatal_signal.py)."""
        sys.path.insert(0, str(ROOT))
        try:
            from adaspark_app.native import fatal_signal, pricing

            for what, module, without in (("the round's pricing in C", pricing, "the numpy code will run"),
                                           ("the one-line crash handler", fatal_signal,
                                            "a crash will end the process by its signal")):
                try:
                    print(f"adaspark: {what}: {module.build()}", file=sys.stderr)
                except Exception as e:  # noqa: BLE001 - the fallback stays
                    print(f"adaspark: WARNING: {what} not built ({e}); {without}", file=sys.stderr)
        finally:
            sys.path.remove(str(ROOT))


setup(cmdclass={"build_py": BuildWithKernels})
