"""Measurement tools: prompt sets, micro-profiles, the bench runner, results and reports.

Layout (one job per module):
  prompts   Spec-Bench and user prompt files, category filters, seeded sampling
  configs   draft -> target configurations and their ``key=value`` command-line form
  plan      what a run measures and in which (interleaved, seeded) order
  profile   verify-batch scaling and step latencies of any CausalLM (reusable)
  runner    runs a plan, appending one fsynced JSON line per measurement; resume
  results   the JSONL file: writer, tolerant reader
  machine   machine / versions / git metadata for the header record
  analysis  speedups with bootstrap CIs, pooled acceptance, verdicts
  plots     PNG figures;  report  the markdown report
"""

from specdec.bench.profile import step_latency, verify_scaling, verify_times

__all__ = ["step_latency", "verify_scaling", "verify_times"]
