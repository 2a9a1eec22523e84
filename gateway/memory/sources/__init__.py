"""Model profiles from each kind of source: Ollama, llama-server, a GGUF file (pure parsers of their JSON)."""
