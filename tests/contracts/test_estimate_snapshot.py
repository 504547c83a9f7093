"""Every committed row's estimate equals the frozen snapshot (regenerate with `python tests/estimate_snapshot.py`)."""

import json

from estimate_snapshot import SNAPSHOT, current


def test_no_estimate_changed_on_any_committed_row():
    stored = json.loads(SNAPSHOT.read_text())
    now = current()
    assert now.keys() == stored.keys(), "rows added or removed: regenerate the snapshot in the same commit"
    changed = [k for k in now if now[k] != stored[k]]
    assert not changed, f"{len(changed)} estimates changed, e.g. {changed[:3]}"
