"""Small helpers any layer may import, which import no other gateway package: the GGUF reader, lazy package
facades, safe text for logs and labels, URL masking, single-flight probes, stopping background tasks, and the header
rules both sides of the proxy share (hop-by-hop headers, the stream media types).

The bottom layer (tests/test_layers.py holds the order): what is here is needed by packages that sit on
different floors, the memory math and the HTTP edge alike, so it can't live in any one of them."""
