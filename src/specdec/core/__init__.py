"""The algorithm: the round, the loop, the verifiers and the rejection walk, sampling, the
K policies, stop strings and the incremental detokenizer."""
