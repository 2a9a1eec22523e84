"""The simulated GPU host: virtual devices and their processes (vgpu), weight bytes of a GGUF (weights), the KV
cache llama.cpp allocates (kv_cache), what a load costs and where it goes (load_cost), and the GPU as a
Prometheus exporter serves it (exporter)."""
