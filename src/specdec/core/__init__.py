"""The algorithm, read in this order:

round.py          one round: draft K, verify K + 1 in one target pass, keep, roll back
verifiers.py      which drafts a round keeps (the lossless walk; exact matching)
rejection.py      the accept/reject walk and its exact enumeration
sampling.py       logits -> probability rows (temperature, top-k, top-p; greedy = argmax)
loop.py           prefill, then rounds until done: generate_stream, Generation, generate
result.py         Round (one per round) and GenerationResult (the metrics)
policy.py         K per round: FixedK, AdaptiveK, ProfileK
drafter.py        the Drafter interface and its Draft; model_drafter.py: a draft model
stops.py          stop strings exact across tokens and rounds
detokenize.py     incremental detokenizer (text pieces, never a split character)
"""
