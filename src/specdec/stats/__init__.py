"""Every statistic specdec reports: each test, power computation and interval of the
certificates and the bench's speedup intervals, as pure functions
on numpy arrays and torch tensors (scipy for the distributions), every random draw from an
explicit generator, every threshold in ``thresholds``.

Conventions: counts = observed category counts [C]; probs = a known probability row [C] (need
not be normalised); alpha = the significance level, fixed before the data are seen; TV =
total-variation distance, 0.5 * sum |a - b|, in [0, 1]. The unit of every test is an
independent draw (a round, a sequence, a request, or a PIT value, which is independent of
everything before it by construction).

``thresholds``    the levels, powers, confidences and cut-offs
``chisquare``     goodness of fit, homogeneity, rare categories pooled, strata combined
``multiple``      Holm and Bonferroni
``family``        a family of tests as records, Holm-adjusted, with their detectable TV
``tv``            TV estimates with distribution-free intervals; the softmax TV bound
``power``         the power of a chi-square test and the smallest TV it detects (analytic)
``simulated``     the hardest alternative, and power by simulation
``pit``           the randomised PIT of a token against its row (full or top-N rows)
``uniformity``    Anderson-Darling and binned chi-square tests of uniformity
``alternatives``  the per-token test's stated alternatives and its power against them
``intervals``     the Student-t interval of a mean over independent sequences
``bootstrap``     the bench's speedup spread: a geometric mean with a cluster bootstrap interval
"""
