"""The algorithm, read in this order:

round.py          one round: draft K, verify K + 1 in one target pass, keep, roll back
verifiers.py      which drafts a round keeps (the lossless walk; exact matching)
rejection.py      the accept/reject walk and its exact enumeration
sampling.py       logits -> probability rows (temperature, top-k, top-p; greedy = argmax)
processors.py     what a request changes in the logits first, as a function of the context
                  (logit bias, penalties; a grammar's mask): target and draft rows alike
logprobs.py       log-probabilities from rows already computed (raw or processed)
loop.py           prefill, then rounds until done: generate_stream, Generation, generate
result.py         Round (one per round) and GenerationResult (the metrics)
policy.py         K per round: FixedK, AdaptiveK, ProfileK
drafter.py        the Drafter interface and its Draft; model_drafter.py: a draft model
stops.py          stop strings exact across tokens and rounds
detokenize.py     incremental detokenizer (text pieces, never a split character)
model.py          the interface the algorithm needs from a model (CausalLM, Tokenizer); the
                  backends in specdec.models implement it, so they sit above the core
vocab.py          do a draft and a target speak the same ids (and padding between them)
rows.py           a model's logit rows in given pass shapes (what the certificate compares)
"""
