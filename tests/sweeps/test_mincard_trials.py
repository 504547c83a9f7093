"""Which finished limit runs bound the smallest card: torch's OOM under the run's own limit does, an OOM the card's
other processes caused (the device had less free than asked) does not."""

from __future__ import annotations

from sweeps.mincard.trials import device_was_full, status_of

# the start of a real failure under a limit, from a lease's trials (results/raw/trials/mincard.jsonl, H200):
# 4.30 GiB limit, 4.28 GiB reserved, 260 MiB asked, the card nearly empty
LIMIT_OOM = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 260.00 MiB. GPU 0 has a total capacity of 139.80 GiB "
    "of which 105.86 GiB is free. Process 768 has 12.27 GiB memory in use."
)
# the same failure on a card another process had filled: 1.21 GiB asked, 300 MiB free
DEVICE_OOM = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.21 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 300.50 MiB is free. Process 12 has 70.00 GiB memory in use."
)


def test_an_oom_under_the_limit_bounds_the_search():
    assert not device_was_full(LIMIT_OOM)
    assert status_of({"status": "oom", "error": LIMIT_OOM}) == "oom"


def test_an_oom_on_a_full_card_bounds_nothing():
    assert device_was_full(DEVICE_OOM)
    assert status_of({"status": "oom", "error": DEVICE_OOM}) == "error"
    # a library's own allocation failure text with torch's figures in it is read the same way
    assert status_of({"status": "error", "error": "RuntimeError: " + DEVICE_OOM}) == "error"


def test_sizes_are_compared_across_units_and_in_bytes():
    # 1,000 bytes asked with 2.00 KiB free: room; 3.00 KiB asked with 1,024 bytes free: none
    room = "Tried to allocate 1000 bytes. GPU 0 has a total capacity of 1.00 GiB of which 2.00 KiB is free."
    none = "Tried to allocate 3.00 KiB. GPU 0 has a total capacity of 1.00 GiB of which 1024 bytes is free."
    assert not device_was_full(room)
    assert device_was_full(none)


def test_texts_without_torch_figures_keep_their_reading():
    assert status_of({"status": "ok"}) == "ok"
    assert (
        status_of({"status": "error", "error": "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"})
        == "oom"
    )
    assert status_of({"status": "oom", "error": "CUDA out of memory (simulated)"}) == "oom"
    assert status_of({"status": "error", "error": "timeout after 480 s"}) == "error"
    assert status_of({"status": "error", "error": None}) == "error"
