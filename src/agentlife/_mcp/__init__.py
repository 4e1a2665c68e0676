"""Tools from MCP servers.

`MCPServer` (what a server is and how its tools become tool definitions) and the client session that
starts, talks to and stops one.

Private; import from the modules themselves. This ``__init__`` imports nothing.
"""
