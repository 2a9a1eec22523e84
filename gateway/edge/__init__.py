"""The HTTP edge: what happens to a request before it reaches the proxy, and to an error on its way out.

serving (deadlines and connection caps per client), targets (origin-form paths only), routes (the route table and
each route's dialect), headers (the request's side of what crosses the hop; the rules both sides share are
gateway/support/hop_headers.py), expect (``Expect: 100-continue``), limits and refusals (each
client's share of the edge), body/ (decoding, size and memory bounds) and error_boundary (every ``GatewayError``
rendered in the route's dialect)."""
