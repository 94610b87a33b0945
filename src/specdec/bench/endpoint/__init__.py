"""``specdec bench --endpoint``: spec-on vs spec-off on a running server over a concurrency
sweep.

  runner   the plan and the run: groups of concurrent requests, JSONL results with resume
  records  reading a results file back (no HTTP client needed: ``specdec report``)
  report   markdown and a plot from a results file
"""
