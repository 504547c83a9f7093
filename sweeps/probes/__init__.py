"""Memory probes: live tensor storage (tensors), torch.cuda counters, NVML sampling."""
