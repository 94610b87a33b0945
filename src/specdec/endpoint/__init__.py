"""The client of a running OpenAI-compatible server, shared by ``specdec bench --endpoint``
(``specdec.bench.endpoint``) and ``specdec certify --endpoint`` (``specdec.certify.endpoint``),
below both: it imports neither.

``client``   one endpoint: streaming requests with per-request timing, retries, a rate bound
``wire``     reading a reply with bounds on its size and JSON depth (the time bound: client)
``schema``   the shape of every kind of reply, checked once where it arrives
``inflight`` requests on the wire at once, counted at the client
``capacity`` the open files a run's connections need, checked before it starts
``counters`` speculative counters from response bodies and Prometheus /metrics text
``pairing``  spec-on / spec-off: one server with a per-request switch, or two servers
``errors``   what a user can cause (one line, exit status 2)
(the ``--endpoint`` options of ``specdec bench`` and ``specdec certify`` live in
``specdec.cli.endpoint``)

Nothing is sent anywhere but the URLs given (the HTTP client ignores proxy settings from the
environment).
"""
