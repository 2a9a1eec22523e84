"""Simulated llama-server: slots and the KV pool (llama_engine), request parsing (llama_requests), the generation
routes and their reply shapes (llama_routes, llama_formats), and the informational routes (llama_info)."""
