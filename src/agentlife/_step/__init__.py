"""The step API.

`StepContext` and what a step's calls go through (tool calls, LLM calls, streaming, structured
output), and `ToolAgent`.

Private; import from the modules themselves. This ``__init__`` imports nothing.
"""
