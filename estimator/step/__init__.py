"""One GRPO step: the terms assembled into phases (single GPU, FSDP, offload), the peak, and the estimate."""
