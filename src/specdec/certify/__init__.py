"""``specdec certify``: statistically valid evidence that a speculative-decoding setup is
lossless, at three levels (synthetic walk, mock models, the real setup), plus a
batch-invariance probe. See docs/certify.md.

Modules: synthetic (Level 1), mock_level (Level 2; its runs on the mocks are
``specdec.mock_runs``), real (Level 3), pertoken (Level 3's
per-token test: the model's rows), stats (every test, power computation and interval: the
pure math), invariance (the probe), shape_matched (the batch-shape-matched plain baseline),
prefix_cache, faults (deliberate bugs and faulty backends for self-tests), plan (quick / full
sizes), runner, api (``certify_models``), report, prompts, progress, seeds (one seed plan per
run), common (statuses and small helpers).
"""

from specdec.certify.api import certify_models
from specdec.certify.invariance import InvarianceResult, batch_invariance
from specdec.certify.mock_level import Level2Config, Level2Result, run_level2
from specdec.certify.real import Level3Config, Level3Result, run_level3
from specdec.certify.report import Certificate, write_certificate
from specdec.certify.runner import CertifyConfig, run_certificate
from specdec.certify.shape_matched import shape_matched_generate, shape_matched_stream
from specdec.certify.synthetic import Level1Config, Level1Result, run_level1

__all__ = [
    "Certificate",
    "CertifyConfig",
    "InvarianceResult",
    "Level1Config",
    "Level1Result",
    "Level2Config",
    "Level2Result",
    "Level3Config",
    "Level3Result",
    "batch_invariance",
    "certify_models",
    "run_certificate",
    "run_level1",
    "run_level2",
    "run_level3",
    "shape_matched_generate",
    "shape_matched_stream",
    "write_certificate",
]
