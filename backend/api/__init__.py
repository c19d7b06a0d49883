"""The chat as a service for tools: the OpenAI-compatible API (/v1), per-user keys, and the key page with each user's
usage (the quotas, shared with the chat, are backend.storage.quotas)."""
