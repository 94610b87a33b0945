"""Shared set-up: everything here is offline, tiny and seeded.

Mock-sized tensor work runs fastest on one thread, and a busy 2-core machine punishes
oversubscription, so the suite uses one torch thread throughout.
"""

from __future__ import annotations

import torch

torch.set_num_threads(1)
