"""``specdec bench``: the bench runner, results and reports.

Layout (one job per module):
  configs   draft -> target configurations and their ``key=value`` command-line form
  plan      what a run measures and in which (interleaved, seeded) order
  profile   one configuration's micro-profile (verify curve, step latencies, c), from the
            timed passes of ``profiler.passes``
  runner    runs a plan, appending one fsynced JSON line per measurement; resume
  results   the JSONL file: writer, tolerant reader
  analysis  speedups with bootstrap CIs, pooled acceptance, verdicts
  plots     PNG figures;  report  the markdown report
The prompt sets (``specdec.prompt_sets``) and machine facts (``specdec.util.machine``) sit below
the public API, so that loading a pair never imports a measurement tool.
"""
