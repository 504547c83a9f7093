"""The harness drops bitsandbytes' CPU notice about the optional Hub kernel, and only that message."""

import logging

import sweeps  # noqa: F401 (installs the filter)


def _passed(message: str) -> list[str]:
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    handler = Keep()
    logger.addHandler(handler)
    try:
        logger.warning(message)
    finally:
        logger.removeHandler(handler)
    return seen


def test_the_hub_kernel_notice_is_dropped():
    # bitsandbytes 0.50.2 backends/cpu/ops.py, with `kernels` absent
    assert (
        _passed("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'.")
        == []
    )


def test_other_bitsandbytes_warnings_still_show():
    assert _passed("CUDA library not found") == ["CUDA library not found"]
