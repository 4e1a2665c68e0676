"""Tools from MCP servers.

`MCPServer` (what a server is and how its tools become tool definitions, ``_server``), the validator of a
tool's arguments against the server's JSON Schema with patterns matched in linear time (``_schema``), and
the client session that starts, talks to and stops one (``_client``).

Private; import from the modules themselves. This ``__init__`` imports nothing.
"""
