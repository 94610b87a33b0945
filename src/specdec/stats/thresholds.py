"""Every threshold of the certificates, fixed before any data are seen, in one place: the
defaults of the level configurations, of the endpoint plan and of the statistics below
(each is recorded with the run that used it, in certificate.json)."""

from __future__ import annotations

ALPHA = 0.01  # family-wise significance level of every family of tests
POWER = 0.8  # the power at which a detectable difference is stated
CONFIDENCE = 0.95  # every stated interval (TV, the per-token TV vs plain decoding)
MIN_EXPECTED = 5.0  # chi-square tests: rare categories pooled until every expected count is it
N_BINS = 20  # the binned chi-square test of uniformity of PIT values (dof 19)
EXACT_TOL = 1e-6  # Level 1: largest deviation of the walk's exact distribution (float32 input)
PLAIN_TV_THRESHOLD = 0.02  # Level 3: per-token TV vs plain decoding that a caveat may not exceed
TIE_FACTOR = 2.0  # Level 3: a greedy flip is a near-tie when its top-2 gap is <= this x probe's
TIE_GAP_NATS = 0.1  # the endpoint: a greedy flip is a near-tie when both gaps are <= this
