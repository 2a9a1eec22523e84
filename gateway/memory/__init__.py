"""The memory math and the readings it works on: KV bytes per token as llama.cpp and Ollama allocate them (kv,
ollama_slots), a model's load cost (load_cost), its profile from each kind of source (sources/, profile, presets,
metadata), the fit estimate, host RAM, and live VRAM behind one interface (vram: static and cached; vram_nvml; the
exporter source, which reads over HTTP, is gateway/backends/vram_exporter.py).

Second from the bottom of the layers (tests/test_layers.py), below configuration: every function here takes
plain numbers and names (a cache type, a context size, a byte count), never a settings object, so the settings can be
validated in this package's terms (``config/backends.py`` parses cache types and sizes with ``kv`` and ``vram``) and
a newcomer reads the math without the configuration. It imports only ``gateway.support``.
"""
