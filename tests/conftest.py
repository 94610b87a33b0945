"""Shared set-up: everything here is offline, tiny and seeded.

Mock-sized tensor work runs fastest on one thread, and a busy 2-core machine punishes
oversubscription, so the suite uses one torch thread throughout.
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _own_profile_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Profiles and measured costs that a test writes stay out of the user's cache."""
    monkeypatch.setenv("SPECDEC_PROFILES", str(tmp_path_factory.mktemp("profiles")))
