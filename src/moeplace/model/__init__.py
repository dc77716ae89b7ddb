"""What the model is: its GGUF header, metadata, KV cache and memory per buffer, quantization recipes, twins."""
