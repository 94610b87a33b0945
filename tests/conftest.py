"""Shared fixtures: everything here is offline, tiny and seeded."""

from __future__ import annotations

import torch

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
