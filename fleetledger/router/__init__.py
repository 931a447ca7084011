"""The router: an OpenAI-compatible HTTP front whose backends are the ledger's serving
set — the app, the routing table followed from the ledger, the proxy, its metrics and
its Ray actor."""
