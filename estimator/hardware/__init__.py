"""The hardware: GPU cards as data, and PyTorch's CUDA caching allocator."""
