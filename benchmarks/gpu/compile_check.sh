#!/usr/bin/env bash
# Here, on a CPU machine with CUDA's compiler and no GPU: does llama-cpp-python 0.3.36 with AdaSpark's
# CUDA patch (adaspark_app/native/cuda_exact.patch) compile and link for sm_90 (H100/H200), as run.sh
# and the README's CUDA install build it? Run it after any change to the patch, before spending GPU
# time. It builds the wheel from the trimmed source in .gpu/ into $CHECK_WORK/wheel and prints the
# patched library's exported switch, its size and what it links. On 2 cores (AMD EPYC Zen 3) it took
# 28-30.5 minutes (three runs; on a Zen 4 31.6 with tests beside it, 23 alone; on an Intel Xeon family 6
# model 207, 29 and 21); libggml-cuda.so came to 61 MB (39 MB with xz), too large to carry to the GPU
# beside the 30 MB checkout (64 MiB a call), so the GPU builds its own (run.sh).
#
# What this machine lacks is made up without a GPU:
# - nvcc 13.0 is in /usr/local/cuda-13.0 (NVCC_ROOT), without cuBLAS: its headers and libraries come
#   from PyPI's nvidia-cublas wheel (the CUDA 13.0 one);
# - the driver library libcuda.so is only linked against, so a stub with its soname stands in. It defines
#   the driver functions ggml-cuda calls (its VMM memory pool, device queries): an empty stub was dropped
#   from the library's NEEDED (--as-needed), and the library then failed to load (undefined cuMemCreate).
# The wheel is then imported here, on the stub (CUDA finds no driver, so no GPU): the library loads, and
# exports the patch's switch. That wheel is what benchmarks/gpu/stage.py carries to the GPU.
#
#   bash benchmarks/gpu/compile_check.sh
set -eu
REPO=$(pwd); W=${CHECK_WORK:-/tmp/cuda-compile-check}; NVCC_ROOT=${NVCC_ROOT:-/usr/local/cuda-13.0}
T=$W/cudatk; mkdir -p "$W"
[ -x "$NVCC_ROOT/bin/nvcc" ] || { echo "no nvcc in $NVCC_ROOT (NVCC_ROOT=...)"; exit 2; }
# the sdist's build backend: the wheel is built without build isolation, as run.sh builds it
python3 -c "import scikit_build_core" 2>/dev/null || python3 -m pip install -q 'scikit-build-core>=0.9.2'
# a toolkit folder: this machine's CUDA 13.0 plus cuBLAS 13.0 from PyPI, and the driver stub
rm -rf "$T"; mkdir -p "$T/targets/x86_64-linux/lib/stubs" "$T/targets/x86_64-linux/include" "$W/cublas"
for d in bin nvvm; do ln -s "$NVCC_ROOT/$d" "$T/$d"; done
cp -as "$NVCC_ROOT/targets/x86_64-linux/include/." "$T/targets/x86_64-linux/include/"
cp -as "$NVCC_ROOT/targets/x86_64-linux/lib/." "$T/targets/x86_64-linux/lib/"
python3 -m pip download -q --no-deps --only-binary=:all: 'nvidia-cublas==13.0.*' -d "$W/cublas"
(cd "$W/cublas" && python3 -m zipfile -e nvidia_cublas-*.whl .)
cp "$W"/cublas/nvidia/cu13/include/* "$T/targets/x86_64-linux/include/"
for f in "$W"/cublas/nvidia/cu13/lib/*.so.13; do
  b=$(basename "$f" .13); ln -sf "$f" "$T/targets/x86_64-linux/lib/$b.13"; ln -sf "$b.13" "$T/targets/x86_64-linux/lib/$b"
done
ln -s targets/x86_64-linux/include "$T/include"; ln -s targets/x86_64-linux/lib "$T/lib64"
DRIVER_FUNCS="cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve cuMemCreate
cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap"
for f in $DRIVER_FUNCS; do echo "int $f(void) { return 999; }"; done >"$W/stub.c"  # 999: CUDA_ERROR_UNKNOWN
cc -shared -fPIC -o "$T/targets/x86_64-linux/lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 "$W/stub.c"
mkdir -p "$W/driver"; cp "$T/targets/x86_64-linux/lib/stubs/libcuda.so" "$W/driver/libcuda.so.1"
# the patched source, built as run.sh builds it on the GPU
rm -rf "$W/src"; mkdir -p "$W/src"; tar -xJf .gpu/llama-cpp-python-0.3.36-src.tar.xz -C "$W/src"
PYTHONPATH=$REPO python3 -m adaspark_app.native.cuda_exact "$W/src"
rm -rf "$W/wheel"; mkdir -p "$W/wheel"; t0=$(date +%s)
CUDACXX=$T/bin/nvcc CMAKE_ARGS="-DGGML_CUDA=on -DLLAVA_BUILD=OFF -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} \
-DCUDAToolkit_ROOT=$T -DCMAKE_CUDA_COMPILER=$T/bin/nvcc -DGGML_NATIVE=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip wheel --no-build-isolation --no-deps -w "$W/wheel" "$W/src" \
  >"$W/build.log" 2>&1 || { tail -n 30 "$W/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
rm -rf "$W/x"; mkdir -p "$W/x"; (cd "$W/x" && python3 -m zipfile -e "$W"/wheel/llama_cpp_python-*.whl .)
lib=$W/x/llama_cpp/lib/libggml-cuda.so
nm -D --defined-only "$lib" | grep adaspark_cuda_exact_rows || { echo "the patched switch is not exported"; exit 1; }
nm -D --defined-only "$lib" | grep adaspark_cuda_graphs || { echo "no graph switch: built without CUDA graphs?"; exit 1; }
nm -D --defined-only "$lib" | grep adaspark_cuda_set_argmax || { echo "the argmax switch is not exported"; exit 1; }
ls -la "$lib"; readelf -d "$lib" | grep NEEDED
readelf -d "$lib" | grep -q 'libcuda\.so\.1' || { echo "libggml-cuda does not name libcuda.so.1: it will not load"; exit 1; }
missing=$(nm -D --undefined-only "$lib" | awk '$2 ~ /^cu[A-Z]/ {print $2}' | while read -r f; do
  case " $(echo $DRIVER_FUNCS) " in *" $f "*) ;; *) echo "$f";; esac; done)
[ -z "$missing" ] || echo "driver functions the stub lacks (they link, the GPU's driver has them): $missing"
LD_LIBRARY_PATH=$T/targets/x86_64-linux/lib:$W/driver PYTHONPATH=$W/x:$REPO python3 -c "
import llama_cpp
from adaspark_app.native.cuda_exact import library_rows
assert library_rows() is not None, 'the switch is not mapped'
print('the CUDA build loads here (no GPU: CUDA finds no driver) and maps the switch')" || exit 1
