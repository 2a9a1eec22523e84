"""Ollama's compatibility routes: OpenAI /v1/chat/completions and /v1/completions (openai_routes), the Responses
API (responses_*), Anthropic's /v1/messages (anthropic_*), and what they share (chat_compat)."""
