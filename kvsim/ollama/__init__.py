"""Simulated Ollama: its scheduler and runners (scheduler, loaded, load_plan, options, generation), the service
behind its handlers (ollama_service, prompting), its native HTTP API (ollama_routes, ollama_models,
ollama_requests, host_check), Go's JSON, durations and templates (gojson, godur, go_templates), and its
OpenAI/Anthropic/Responses compatibility layer (compat)."""
