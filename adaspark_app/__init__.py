"""AdaSpark: terminal chat with lossless speculative decoding on llama.cpp.

Importing the package has no side effects. A program that loads the model calls
``adaspark_app.native.activate()`` first, before anything imports ``llama_cpp``, to run on the
Q4_1 multi-row kernels if they were built (the ``adaspark`` command does).
"""
