"""``specdec certify --endpoint``: the certificate of a running OpenAI-compatible server,
spec-on against spec-off (see ``certificate`` for the design and its modules)."""
