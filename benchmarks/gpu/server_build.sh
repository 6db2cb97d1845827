#!/usr/bin/env bash
# Here, on a CPU machine: llama.cpp's llama-server for the GPU run, from the source vendored in the
# llama-cpp-python 0.3.36 sdist (the full one: the trimmed copy in .gpu/ has no tools/server), built
# against shared libraries and without CUDA. On the GPU it runs with the CUDA wheel's libllama and
# libggml (LD_LIBRARY_PATH: same source, same sonames), so the GPU build is compiled once, by
# compile_check.sh; what it adds is the binary and libmtmd. benchmarks/gpu/stage.py packs both:
#
#   bash benchmarks/gpu/server_build.sh      # ~10 min on 2 cores; prints the binary's path
#   python -m benchmarks.gpu.stage pack --wheel CUDA_WHEEL --server /tmp/adaspark-server/bin/llama-server
#
# SDIST: an unpacked llama_cpp_python-0.3.36 sdist (default: downloaded from PyPI into $W/sdist).
set -eu
W=${SERVER_WORK:-/tmp/adaspark-server-src}; B=${SERVER_BUILD:-/tmp/adaspark-server}
SDIST=${SDIST:-$W/sdist/llama_cpp_python-0.3.36}
if [ ! -d "$SDIST/vendor/llama.cpp/tools/server" ]; then
  mkdir -p "$W/sdist"
  python3 -m pip download -q --no-deps --no-binary=:all: llama-cpp-python==0.3.36 -d "$W/sdist"
  tar -xzf "$W/sdist/llama_cpp_python-0.3.36.tar.gz" -C "$W/sdist"
fi
# no CPU-specific code (the GPU host's CPU is another), no network client, shared libraries
cmake -S "$SDIST/vendor/llama.cpp" -B "$B" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF >"$B.configure.log" 2>&1  # (a warning: no web UI assets; the API needs none)
cmake --build "$B" --target llama-server -j"$(nproc)" >"$B.build.log"
readelf -d "$B/bin/llama-server" | grep NEEDED
echo "$B/bin/llama-server"
