"""The chat as a service for tools: the OpenAI-compatible API (/v1), per-user keys, quotas and usage."""
