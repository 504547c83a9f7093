"""The harness: real GRPO steps (runner), fake-tensor traces (trace), the min-card search, reports, leases.

Importing it installs one logging filter. bitsandbytes 0.50, imported by PEFT whenever TRL is, looks on a CPU
with AVX512-BF16 for the optional `kernels` package's Hub kernel for CPU 4-bit matmuls and logs a warning when
it is absent (`bitsandbytes/backends/cpu/ops.py`). The lock does not install `kernels`, so every measured-cpu
row ran bitsandbytes' own CPU path, and the warning is noise on every trace and report; the filter drops that
one message and nothing else.
"""

import logging


class _NoHubKernelNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "kernels-community" not in record.getMessage()


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_NoHubKernelNotice())
