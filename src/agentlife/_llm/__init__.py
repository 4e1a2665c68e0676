"""Model clients.

The `LLMClient` protocol, the stream guard, the Anthropic and OpenAI-compatible adapters, the scripted
model, the default client by provider, and prices.

Private; import from the modules themselves. This ``__init__`` imports nothing.
"""
