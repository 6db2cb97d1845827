"""The header values llama.cpp aborts on (adaspark_app.llama_aborts), on metadata alone; the same
refusals on real files are in test_cli_errors.py and the opt-in test_real_targets.py."""

import pytest


@pytest.mark.parametrize("extra, problem", [
    ({}, None),
    ({"qwen3moe.expert_count": 128, "qwen3moe.expert_used_count": 8}, None),  # Qwen3-30B-A3B
    ({"qwen3moe.expert_count": 256, "qwen3moe.expert_used_count": 8, "qwen3moe.expert_group_count": 8,
      "qwen3moe.expert_group_used_count": 4}, None),  # DeepSeek-V3's routing
    ({"qwen3moe.expert_count": 64, "qwen3moe.expert_used_count": [0, 6, 6, 6]}, None),  # per layer
    ({"qwen3moe.nextn_predict_layers": 1}, None),
    ({"qwen3moe.rope.scaling.type": "yarn"}, None),
    ({"qwen3moe.block_count": 0}, "block_count is 0"),
    ({"qwen3moe.nextn_predict_layers": 5}, "nextn_predict_layers is 5, more than its 4 layers"),
    ({"qwen3moe.expert_count": 2000, "qwen3moe.expert_used_count": 8}, "at most 1024"),
    ({"qwen3moe.expert_used_count": 2}, "expert_used_count is 2, more than the 0 experts"),
    ({"qwen3moe.expert_count": 64, "qwen3moe.expert_used_count": [2, 80]}, "expert_used_count is 80"),
    ({"qwen3moe.expert_count": 64}, "expert_used_count is 0"),
    ({"qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2, "qwen3moe.expert_group_count": 8},
     "expert_group_count is 8, not fewer than the 8 experts"),
    ({"qwen3moe.expert_count": 64, "qwen3moe.expert_used_count": 8, "qwen3moe.expert_group_count": 6,
      "qwen3moe.expert_group_used_count": 2}, "groups that divide the experts"),
    ({"qwen3moe.expert_count": 64, "qwen3moe.expert_used_count": 8, "qwen3moe.expert_group_count": 8,
      "qwen3moe.expert_group_used_count": 8}, "at least one group unused"),
    ({"qwen3moe.expert_group_count": 4}, "expert_group_count is 4 with no experts"),
    ({"qwen3moe.rope.scaling.type": "bogus"}, "rope.scaling.type is 'bogus'"),
    ({"qwen3moe.expert_count": "64", "qwen3moe.rope.scaling.type": 3}, None),  # wrong types: llama.cpp's own error
    # the head size against the rope dimensions (asserted by the qwen3moe graph at the first forward)
    ({"qwen3moe.embedding_length": 2048, "qwen3moe.attention.head_count": 32, "qwen3moe.attention.key_length": 128,
      "qwen3moe.attention.value_length": 128, "qwen3moe.rope.dimension_count": 128}, None),  # Qwen3-30B-A3B
    ({"qwen3moe.embedding_length": 2048, "qwen3moe.attention.head_count": 32}, None),  # 64, the default
    ({"qwen3moe.embedding_length": 2048, "qwen3moe.attention.head_count": 32, "qwen3moe.rope.dimension_count": 32},
     "rope.dimension_count is 32 but its attention heads are 64 wide"),
    ({"qwen3moe.embedding_length": 2048, "qwen3moe.attention.head_count": [32, 32, 16, 16],
      "qwen3moe.attention.key_length": 128}, "attention heads are 64 wide"),  # key 128, value 2048 / 32
    ({"qwen3moe.embedding_length": 2048, "qwen3moe.attention.head_count": 32, "qwen3moe.attention.key_length": 96,
      "qwen3moe.attention.value_length": 64, "qwen3moe.rope.dimension_count": 64}, "key_length is 96"),
    ({"qwen3moe.embedding_length": 2048, "qwen3moe.attention.head_count": 32, "qwen3moe.rope.dimension_count": 32,
      "qwen3moe.attention.sliding_window": 4096}, None),  # layers of two sizes: not checked here
])
def test_hyperparameters_llama_cpp_asserts_on_are_named_and_real_ones_pass(extra, problem):
    """llama.cpp's load_hparams asserts (the process ends) on each case named here; the rules are
    its, in its order, checked on the metadata alone. The passing rows are real models' routing."""
    from adaspark_app.llama_aborts import hparams_problem

    kv = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 4, **extra}
    found = hparams_problem(kv)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
    hunyuan = {"general.architecture": "hunyuan-dense", "hunyuan-dense.block_count": 4,
               "hunyuan-dense.expert_count": 1, "hunyuan-dense.expert_used_count": 1}
    assert hparams_problem(hunyuan) is None  # its loader drops an expert count of 1 first
    # MiniMax's rope covers half a head (its graph's assertion is commented out): not refused
    minimax = {"general.architecture": "minimax-m2", "minimax-m2.block_count": 4, "minimax-m2.embedding_length": 3072,
               "minimax-m2.attention.head_count": 48, "minimax-m2.attention.key_length": 128,
               "minimax-m2.attention.value_length": 128, "minimax-m2.rope.dimension_count": 64}
    assert hparams_problem(minimax) is None


@pytest.mark.parametrize("arch, extra, problem", [
    # a norm's epsilon: ggml's norms assert it is 0 or more (a NaN fails the test too)
    ("llama", {"llama.attention.layer_norm_rms_epsilon": 1e-5}, None),
    ("llama", {"llama.attention.layer_norm_rms_epsilon": 0.0}, None),
    ("llama", {"llama.attention.layer_norm_rms_epsilon": float("nan")}, "layer_norm_rms_epsilon is nan"),
    ("gpt2", {"gpt2.attention.layer_norm_epsilon": -1e-5}, "layer_norm_epsilon is -1e-05"),
    ("llama", {"llama.attention.group_norm_epsilon": float("-inf")}, "group_norm_epsilon is -inf"),
    # a sliding-window pattern with no sliding layer, where the window is on
    ("gemma3", {"gemma3.attention.sliding_window": 512}, None),  # Gemma 3: the default pattern, 6
    ("gemma3", {"gemma3.attention.sliding_window": 512, "gemma3.attention.sliding_window_pattern": 1},
     "sliding_window_pattern is 1: none of its 4 layers"),
    ("gemma3", {"gemma3.attention.sliding_window_pattern": 1}, None),  # no window: the pattern is not read
    ("gemma3", {"gemma3.attention.sliding_window": 0, "gemma3.attention.sliding_window_pattern": 1}, None),
    ("gemma2", {"gemma2.attention.sliding_window_pattern": 1}, "none of its 4 layers"),  # Gemma 2: always on
    ("gemma2", {"gemma2.attention.sliding_window_pattern": 0}, None),  # 0: every layer slides
    ("gemma2", {"gemma2.attention.sliding_window_pattern": 7}, None),
    ("gpt-oss", {"gpt-oss.attention.sliding_window_pattern": [True, False, True, False]}, None),
    ("gpt-oss", {"gpt-oss.attention.sliding_window_pattern": [False, False, False, False]}, "makes none of its 4"),
    ("gpt-oss", {"gpt-oss.attention.sliding_window_pattern": [0, 0, 0, 0, 1]}, "makes none"),  # past the layers
    ("gemma4", {"gemma4.attention.sliding_window_pattern": [0, 1, 0, 0]}, None),
    ("gemma4", {"gemma4.attention.sliding_window_pattern": 1}, None),  # a number: llama.cpp's own error
    ("gemma4", {"gemma4.attention.sliding_window_pattern": ["", ""]}, None),  # strings: its error too
    ("cohere2moe", {"cohere2moe.attention.sliding_window_pattern": 4}, None),  # dense first: 0 of every 4
    ("cohere2moe", {"cohere2moe.attention.sliding_window_pattern": 1}, "is 1"),
    ("cohere2moe", {"cohere2moe.block_count": 1, "cohere2moe.attention.sliding_window_pattern": 4}, "is 4"),
    ("llama4", {"llama4.attention.sliding_window_pattern": 1}, "is 1"),  # chunked unless the window is 0
    ("llama4", {"llama4.attention.sliding_window": 0, "llama4.attention.sliding_window_pattern": 1}, None),
    ("exaone4", {"exaone4.attention.sliding_window_pattern": 1}, None),  # on only for its 64-layer 32B
    ("exaone4", {"exaone4.block_count": 64, "exaone4.attention.sliding_window_pattern": 1}, "is 1"),
    ("phi3", {"phi3.attention.sliding_window": 2047, "phi3.attention.sliding_window_pattern": 1}, None),  # off
    # the rope's dimension count: even, above 0 (at 0 its loop never ends), at most the head
    ("gemma3", {"gemma3.attention.key_length": 256, "gemma3.rope.dimension_count": 256}, None),
    ("gemma3", {"gemma3.attention.key_length": 256, "gemma3.rope.dimension_count": 128}, None),  # part of a head
    ("gemma3", {"gemma3.attention.key_length": 256, "gemma3.rope.dimension_count": 0}, "is 0; llama.cpp's rope"),
    ("gemma3", {"gemma3.attention.key_length": 256, "gemma3.rope.dimension_count": 255}, "is 255"),
    ("gemma3", {"gemma3.attention.key_length": 256, "gemma3.rope.dimension_count": 258}, "more than its 256-wide"),
    ("gemma3", {"gemma3.embedding_length": 640, "gemma3.attention.head_count": 4,
                "gemma3.rope.dimension_count": 192}, "more than its 160-wide"),  # the head: 640 / 4
    ("gemma3", {"gemma3.rope.dimension_count_swa": 3}, "dimension_count_swa is 3"),
    ("gemma3", {"gemma3.attention.key_length": 256, "gemma3.attention.key_length_swa": 128,
                "gemma3.rope.dimension_count": 256}, "dimension_count_swa is 256, more than its 128-wide"),
    ("deepseek2", {"deepseek2.attention.key_length": 576, "deepseek2.attention.kv_lora_rank": 512,
                   "deepseek2.rope.dimension_count": 64}, None),  # DeepSeek-V3's MLA
    ("gpt2", {"gpt2.rope.dimension_count": 0}, None),  # no rope in its graph
    # per-layer head counts where llama.cpp sizes the weights by layer 0's (the cache takes each layer's)
    ("llama", {"llama.attention.head_count_kv": [8, 8, 8, 8]}, None),
    ("llama", {"llama.attention.head_count_kv": [8, 8, 4, 8]}, "head_count_kv says layer 2 has 4 heads and layer 0 8"),
    ("llama", {"llama.attention.head_count_kv": [8, 8, 0, 8]}, "layer 2 has 0 heads"),
    ("llama", {"llama.attention.head_count": [32, 32, 16, 32]}, "head_count says layer 2 has 16"),  # no kv: the same
    ("llama", {"llama.attention.head_count": [32, 32, 16, 32], "llama.attention.head_count_kv": 8}, None),  # unread
    ("granite", {"granite.attention.head_count": [32, 32, 16, 32], "granite.attention.head_count_kv": 8},
     "granite.attention.head_count says layer 2"),  # granite's graph reads each layer's query heads
    ("llama", {"llama.attention.head_count_kv": [8, 8, 4]}, None),  # not one per layer: llama.cpp's error
    ("llama", {"llama.attention.head_count_kv": [8.0, 8.0, 4.0, 8.0]}, None),  # not whole numbers: its error too
    ("openelm", {"openelm.attention.head_count_kv": [3, 3, 4, 4]}, None),  # OpenELM: sized layer by layer
    ("jamba", {"jamba.attention.head_count_kv": [0, 8, 0, 0]}, None),  # Jamba: 0 marks a recurrent layer
])
def test_values_llama_cpp_asserts_on_at_the_first_forward_are_named(arch, extra, problem):
    """Each case ends the process in llama.cpp (an assertion in a norm, the sliding-window cache, the
    rope op or storing a layer's keys; a rope of 0 dimensions hangs the first forward instead), found
    on Gemma-3-270M and the bundled model with each value set (the opt-in target test, and
    test_cli_errors for the per-layer heads); the passing rows are real models' values or
    values llama.cpp refuses with an error of its own."""
    from adaspark_app.llama_aborts import hparams_problem

    found = hparams_problem({"general.architecture": arch, f"{arch}.block_count": 4, **extra})
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_the_line_an_assertion_ends_the_process_with_names_the_check_and_the_files(monkeypatch):
    """ggml's message names its source by the build's full path; the line keeps the file name, the
    line number and the check, on one line, and the model files loaded, latest last."""
    from adaspark_app.engine import backend

    monkeypatch.setattr(backend, "_loaded", [])
    message = ("/tmp/pip-install-x/llama-cpp-python/vendor/llama.cpp/ggml/src/ggml.c:4014: "
               "GGML_ASSERT(a->ne[0] ==\nb) failed")
    assert "with no model loaded yet" in backend.abort_line(message)
    backend._loaded.extend(["/m/target.gguf", "/m/drafter.gguf"])
    line = backend.abort_line(message)
    assert "(ggml.c:4014: GGML_ASSERT(a->ne[0] == b) failed) with /m/target.gguf and /m/drafter.gguf" in line
    assert "\n" not in line and "/vendor/" not in line
    assert "(no file named: the check) with" in backend.abort_line("no file named: the check")


def test_the_line_an_uncaught_cxx_exception_ends_the_process_with_names_its_type_and_the_files(monkeypatch):
    from adaspark_app.engine import backend

    monkeypatch.setattr(backend, "_loaded", ["/m/target.gguf"])
    line = backend.terminate_line("std::out_of_range")
    assert line.startswith("llama.cpp stopped on an error it does not handle (std::out_of_range) with /m/target.gguf: ")
    assert "(of a type not known)" in backend.terminate_line("")
    assert "\n" not in backend.terminate_line("a\nb")

