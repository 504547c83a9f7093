"""Tiny model configs more than one test folder builds (random weights, nothing downloaded)."""

# the tracer tests' tiny Qwen2 (tests/sweeps/test_trace.py, test_trace_distributed.py, tests/accuracy/)
TINY_QWEN2 = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 8000,
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}
