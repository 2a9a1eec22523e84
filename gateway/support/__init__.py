"""Small helpers any layer may import, which import no other gateway package: the GGUF reader, lazy package
facades, safe text for logs and labels, URL masking, single-flight probes and stopping background tasks."""
