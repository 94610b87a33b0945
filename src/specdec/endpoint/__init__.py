"""Measure and certify speculative decoding in a running OpenAI-compatible server.

``client``   one endpoint: streaming requests with per-request timing, retries, a rate bound
``wire``     reading a reply with bounds on its size and JSON depth (the time bound: client)
``schema``   the shape of every kind of reply, checked once where it arrives
``inflight`` requests on the wire at once, counted at the client
``capacity`` the open files a run's connections need, checked before it starts
``counters`` speculative counters from response bodies and Prometheus /metrics text
``pairing``  spec-on / spec-off: one server with a per-request switch, or two servers
``bench``    spec-on vs spec-off over a concurrency sweep, JSONL results with resume
``records``  reading a results file back (no HTTP client needed)
``report``   markdown and a plot from a results file
``certify``  greedy agreement and sampled two-sample tests, with stated power
(the ``--endpoint`` options of ``specdec bench`` and ``specdec certify`` live in
``specdec.cli.endpoint``)

Nothing is sent anywhere but the URLs given (the HTTP client ignores proxy settings from the
environment).
"""
